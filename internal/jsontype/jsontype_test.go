package jsontype

import "testing"

func TestOf(t *testing.T) {
	tests := []struct {
		name, in, want string
	}{
		{"empty", ``, "nothing"},
		{"only_space", " \n\t\r", "nothing"},
		{"string", `"a"`, "string"},
		{"object_after_space", "\r\n {}", "object"},
		{"array", `[1]`, "array"},
		{"true", `true`, "boolean"},
		{"false", `false`, "boolean"},
		{"null", `null`, "null"},
		{"negative", `-1`, "number"},
		{"exponent", `3.5e2`, "number"},
		{"not_json", `?`, "number"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := Of([]byte(tc.in)); got != tc.want {
				t.Errorf("Of(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

func TestIsNull(t *testing.T) {
	tests := []struct {
		in   string
		want bool
	}{
		{`null`, true},
		{" null\n", true},
		{`nul`, false},
		{`"null"`, false},
		{`nullx`, false},
		{``, false},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			if got := IsNull([]byte(tc.in)); got != tc.want {
				t.Errorf("IsNull(%q) = %v, want %v", tc.in, got, tc.want)
			}
		})
	}
}
