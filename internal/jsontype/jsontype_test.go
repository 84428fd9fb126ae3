package jsontype

import "testing"

func TestOf(t *testing.T) {
	for in, want := range map[string]string{
		``: "nothing", " \n\t": "nothing",
		`"a"`: "string", ` {}`: "object", `[1]`: "array",
		`true`: "boolean", `false`: "boolean", `null`: "null",
		`-1`: "number", `3.5e2`: "number",
	} {
		if got := Of([]byte(in)); got != want {
			t.Errorf("Of(%q) = %q, want %q", in, got, want)
		}
	}
}
