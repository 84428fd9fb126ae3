// Package jsontype names the type of a JSON value, for the decoders'
// error messages ("want a string, got number"), and tells a null apart.
package jsontype

import "bytes"

// Of names the type of JSON value v from its first byte, as the JSON
// spec names them: "string", "object", "array", "boolean", "null" and,
// for any other first byte, "number"; "nothing" for a value that is only
// space. It reads no further: v is taken to be valid JSON.
func Of(v []byte) string {
	v = bytes.TrimLeft(v, " \t\r\n")
	if len(v) == 0 {
		return "nothing"
	}
	switch v[0] {
	case '"':
		return "string"
	case '{':
		return "object"
	case '[':
		return "array"
	case 't', 'f':
		return "boolean"
	case 'n':
		return "null"
	}
	return "number"
}

// IsNull reports whether v is JSON null, space around it allowed.
func IsNull(v []byte) bool { return string(bytes.TrimSpace(v)) == "null" }
