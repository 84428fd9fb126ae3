package pgbreaker

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

// A state notice's payload is read back as swapSQL writes it, keys with
// colons and non-ASCII text included; anything else is refused.
func TestParseNotice(t *testing.T) {
	tests := []struct {
		payload string
		want    notice
		ok      bool
	}{
		{"s16384:7:eyJ2IjoyfQ==:openai/gpt-4o", notice{table: 16384, key: "openai/gpt-4o", version: 7, state: []byte(`{"v":2}`), carried: true}, true},
		{"s16384:2:eA==:a:b/ü", notice{table: 16384, key: "a:b/ü", version: 2, state: []byte("x"), carried: true}, true},
		{"n5:9:a:b", notice{table: 5, key: "a:b", version: 9}, true},
		{"s5:1:a!!:k", notice{}, false},    // not base64
		{"s5:1:eA==", notice{}, false},     // no key after the state
		{"s5:0:eA==:k", notice{}, false},   // no write makes version 0
		{"s0:1:eA==:k", notice{}, false},   // no table has oid 0
		{"s1:eA==", notice{}, false},       // no version
		{"openai/gpt-4o", notice{}, false}, // channel's payload, the key alone
		{"x5:1:eA==:k", notice{}, false},   // neither s nor n
		{"", notice{}, false},
	}
	for _, tc := range tests {
		got, ok := parseNotice(tc.payload)
		if ok != tc.ok || !cmp.Equal(got, tc.want, cmp.AllowUnexported(notice{})) {
			t.Errorf("parseNotice(%q) = %+v, %v; want %+v, %v", tc.payload, got, ok, tc.want, tc.ok)
		}
	}
}
