package llmretry_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"math"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/llmretry/llmretry"
)

func TestAttemptString(t *testing.T) {
	tests := []struct {
		name string
		a    llmretry.Attempt
		want string
	}{
		{
			name: "status_failure",
			a:    llmretry.Attempt{Backend: 0, Model: "gpt-4o", Try: 1, Kind: llmretry.KindTransient, Status: 500, Err: llmretry.StatusFailure(500, nil, errors.New("upstream on fire"))},
			want: "[backend 0 gpt-4o try 1] http 500: upstream on fire",
		},
		{
			name: "parse_failure",
			a:    llmretry.Attempt{Backend: 1, Model: "claude", Try: 3, Kind: llmretry.KindParse, Err: llmretry.ParseFailure("[1]]", errors.New("unexpected ]"))},
			want: "[backend 1 claude try 3] parse: unexpected ]",
		},
		{
			name: "plain_error",
			a:    llmretry.Attempt{Backend: 2, Model: "unknown", Try: 2, Err: errors.New("connection reset")},
			want: "[backend 2 unknown try 2] connection reset",
		},
		{
			name: "success",
			a:    llmretry.Attempt{Backend: 0, Model: "gpt-4o", Try: 2},
			want: "[backend 0 gpt-4o try 2] ok",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.a.String(); got != tc.want {
				t.Errorf("String() = %q, want %q", got, tc.want)
			}
		})
	}
}

// errorsByMessage matches errors by their text: a decoded Attempt keeps only
// the message of its Err.
var errorsByMessage = cmp.Comparer(func(x, y error) bool {
	if x == nil || y == nil {
		return x == nil && y == nil
	}
	return x.Error() == y.Error()
})

func TestAttemptJSONRoundTrip(t *testing.T) {
	start := time.Date(2025, 3, 1, 12, 0, 0, 250_000_000, time.UTC)
	tests := []struct {
		name string
		a    llmretry.Attempt
	}{
		{
			name: "full",
			a: llmretry.Attempt{
				Backend: 1, Model: "gpt-4o", Try: 2, Kind: llmretry.KindParse, Status: 200,
				Err:     llmretry.ParseFailure(`{"a":`, errors.New("unexpected end of JSON input")),
				RawText: ptr(`{"a":`), Start: start, Elapsed: 1500 * time.Millisecond, RetryIn: 250 * time.Millisecond, Delivered: true,
			},
		},
		{
			name: "raw_text_nil",
			a:    llmretry.Attempt{Backend: 0, Model: "m", Try: 1, Kind: llmretry.KindTransient, Status: 503, Err: errors.New("http 503"), Start: start},
		},
		{
			name: "raw_text_empty",
			a:    llmretry.Attempt{Backend: 0, Model: "m", Try: 1, Kind: llmretry.KindParse, Err: errors.New("parse: empty"), RawText: ptr(""), Start: start},
		},
		{
			name: "raw_text_unicode",
			a:    llmretry.Attempt{Backend: 0, Model: "m", Try: 1, Kind: llmretry.KindTruncated, Err: errors.New("truncated"), RawText: ptr("«naïve» \u2028 \"quoted\"\n"), Start: start},
		},
		{
			name: "success",
			a:    llmretry.Attempt{Backend: 3, Model: "m", Try: 1, Start: start, Elapsed: 2 * time.Second},
		},
		{
			name: "continued",
			a:    llmretry.Attempt{Backend: 1, Model: "m", Try: 2, Start: start, Delivered: true, ContinuedFrom: 42},
		},
		{
			name: "restarted",
			a:    llmretry.Attempt{Backend: 0, Model: "m", Try: 3, Kind: llmretry.KindTransient, Err: errors.New("cut"), Start: start, Restarted: true},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			data, err := json.Marshal(tc.a)
			if err != nil {
				t.Fatalf("json.Marshal() error = %v", err)
			}
			var got llmretry.Attempt
			if err := json.Unmarshal(data, &got); err != nil {
				t.Fatalf("json.Unmarshal(%s) error = %v", data, err)
			}
			if diff := cmp.Diff(tc.a, got, errorsByMessage, cmpopts.IgnoreUnexported(llmretry.Attempt{})); diff != "" {
				t.Errorf("round trip of %s (-want +got):\n%s", data, diff)
			}
			// nil and "" are different facts: no output, and an empty output.
			if (tc.a.RawText == nil) != (got.RawText == nil) {
				t.Errorf("round trip RawText = %v, want nil: %t", got.RawText, tc.a.RawText == nil)
			}
		})
	}
}

func TestAttemptJSONKeys(t *testing.T) {
	a := llmretry.Attempt{
		Backend: 1, Model: "gpt-4o", Try: 2, Kind: llmretry.KindParse, Status: 200,
		Err:     llmretry.ParseFailure("{", errors.New("unexpected end of JSON input")),
		RawText: ptr("{"), Start: time.Date(2025, 3, 1, 12, 0, 0, 250_000_000, time.UTC),
		Elapsed: 1500 * time.Millisecond, RetryIn: 250 * time.Millisecond, Delivered: true,
	}
	data, err := json.Marshal(a)
	if err != nil {
		t.Fatalf("json.Marshal() error = %v", err)
	}
	var got map[string]any
	if err := json.Unmarshal(data, &got); err != nil {
		t.Fatalf("json.Unmarshal(%s) error = %v", data, err)
	}
	// start is RFC 3339; check it apart from its exact spelling.
	if s, _ := got["start"].(string); s != "" {
		ts, err := time.Parse(time.RFC3339Nano, s)
		if err != nil || !ts.Equal(a.Start) {
			t.Errorf("start = %q, want RFC 3339 for %v", s, a.Start)
		}
		got["start"] = "ok"
	}
	want := map[string]any{
		"backend":     1.0,
		"model":       "gpt-4o",
		"try":         2.0,
		"kind":        "parse",
		"status":      200.0,
		"error":       "parse: unexpected end of JSON input",
		"raw_text":    "{",
		"start":       "ok",
		"elapsed_ms":  1500.0,
		"retry_in_ms": 250.0,
		"delivered":   true,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("json.Marshal() = %s\n(-want +got):\n%s", data, diff)
	}

	t.Run("continuation", func(t *testing.T) {
		b := a
		b.ContinuedFrom, b.Restarted = 42, true
		data, err := json.Marshal(b)
		if err != nil {
			t.Fatalf("json.Marshal() error = %v", err)
		}
		if !bytes.Contains(data, []byte(`"continued_from":42,"restarted":true`)) {
			t.Errorf("json.Marshal() = %s, want continued_from 42 and restarted true", data)
		}
	})
	t.Run("raw_text_nil_omitted", func(t *testing.T) {
		b := a
		b.RawText = nil
		data, err := json.Marshal(b)
		if err != nil {
			t.Fatalf("json.Marshal() error = %v", err)
		}
		if bytes.Contains(data, []byte(`"raw_text"`)) {
			t.Errorf("json.Marshal() = %s, want no raw_text key", data)
		}
	})
	t.Run("raw_text_empty_kept", func(t *testing.T) {
		b := a
		b.RawText = ptr("")
		data, err := json.Marshal(b)
		if err != nil {
			t.Fatalf("json.Marshal() error = %v", err)
		}
		if !bytes.Contains(data, []byte(`"raw_text":""`)) {
			t.Errorf("json.Marshal() = %s, want \"raw_text\":\"\"", data)
		}
	})
	t.Run("zero_fields_keep_their_keys", func(t *testing.T) {
		// A dead-letter table reads the same columns from every record:
		// only raw_text (absent vs "") and error (nil for a success) may
		// be left out.
		data, err := json.Marshal(llmretry.Attempt{Model: "m", Try: 1, Err: errors.New("x")})
		if err != nil {
			t.Fatalf("json.Marshal() error = %v", err)
		}
		var got map[string]any
		if err := json.Unmarshal(data, &got); err != nil {
			t.Fatalf("json.Unmarshal(%s) error = %v", data, err)
		}
		for _, key := range []string{"backend", "model", "try", "kind", "status", "error", "start", "elapsed_ms", "retry_in_ms", "delivered"} {
			if _, ok := got[key]; !ok {
				t.Errorf("json.Marshal() = %s, want key %q", data, key)
			}
		}
	})
	t.Run("value_pointer_and_slice_agree", func(t *testing.T) {
		byPtr, err1 := json.Marshal(&a)
		inSlice, err2 := json.Marshal([]llmretry.Attempt{a})
		if err1 != nil || err2 != nil {
			t.Fatalf("json.Marshal() errors = %v, %v", err1, err2)
		}
		if string(byPtr) != string(data) || string(inSlice) != "["+string(data)+"]" {
			t.Errorf("json.Marshal(a), (&a), ([]Attempt{a}) = %s, %s, %s, want the same encoding", data, byPtr, inSlice)
		}
	})
	t.Run("bad_input", func(t *testing.T) {
		for _, in := range []string{
			`{"backend":0,"model":"m","try":1,"kind":"sideways"}`,
			`{"backend":0,"model":"m","try":1,"kind":"parse","elapsed_ms":"5"}`,
			`{"backend":0,"model":"m","try":1,"kind":"parse","retry_in_ms":1e300}`,
			`[1, 2]`,
		} {
			var b llmretry.Attempt
			if err := json.Unmarshal([]byte(in), &b); err == nil {
				t.Errorf("json.Unmarshal(%s) error = nil, want an error", in)
			}
		}
	})
}

func TestAttemptLogValue(t *testing.T) {
	a := llmretry.Attempt{
		Backend: 1, Model: "gpt-4o", Try: 2, Kind: llmretry.KindTransient, Status: 503,
		Err:   llmretry.StatusFailure(503, nil, errors.New("busy")),
		Start: time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC), Elapsed: 1500 * time.Millisecond, RetryIn: 250 * time.Millisecond,
	}
	lv, ok := any(a).(slog.LogValuer)
	if !ok {
		t.Fatalf("Attempt does not implement slog.LogValuer")
	}
	v := lv.LogValue()
	if v.Kind() != slog.KindGroup {
		t.Fatalf("LogValue().Kind() = %v, want Group", v.Kind())
	}
	// The group carries the attempt's facts as fields, not one text blob.
	var values []string
	for _, at := range v.Group() {
		values = append(values, at.Value.Resolve().String())
	}
	joined := "\x00" + strings.Join(values, "\x00") + "\x00"
	for _, want := range []string{"1", "gpt-4o", "2", "transient", "503", "http 503: busy"} {
		if !strings.Contains(joined, "\x00"+want+"\x00") {
			t.Errorf("LogValue() fields = %q, want one with value %q", values, want)
		}
	}

	// Through a JSON handler the attempt is a nested object.
	var buf bytes.Buffer
	slog.New(slog.NewJSONHandler(&buf, nil)).LogAttrs(context.Background(), slog.LevelInfo, "attempt", slog.Any("attempt", a))
	var line struct {
		Attempt map[string]any `json:"attempt"`
	}
	if err := json.Unmarshal(buf.Bytes(), &line); err != nil {
		t.Fatalf("slog JSON output %s: %v", buf.Bytes(), err)
	}
	if len(line.Attempt) < 5 {
		t.Errorf("slog JSON attempt = %v, want a group of fields", line.Attempt)
	}
}

func TestAttemptLogValueLeavesOutRawText(t *testing.T) {
	a := llmretry.Attempt{
		Model: "gpt-4o", Try: 1, Kind: llmretry.KindParse,
		Err:     errors.New("parse: bad json"),
		RawText: ptr("PRIVATE-MODEL-OUTPUT"),
	}
	var buf bytes.Buffer
	slog.New(slog.NewJSONHandler(&buf, nil)).Info("attempt", "attempt", a)
	if strings.Contains(buf.String(), "PRIVATE-MODEL-OUTPUT") {
		t.Errorf("slog output = %s, want it without the model's raw output", buf.String())
	}
	if !strings.Contains(buf.String(), "parse: bad json") {
		t.Errorf("slog output = %s, want the error message", buf.String())
	}
}

func TestErrorLogValues(t *testing.T) {
	attempts := []llmretry.Attempt{
		{Backend: 0, Model: "gpt-4o", Try: 1, Kind: llmretry.KindTransient, Status: 503, Err: errors.New("http 503")},
		{Backend: 1, Model: "claude", Try: 1, Kind: llmretry.KindTimeout, Err: errors.New("deadline")},
	}
	tests := []struct {
		name string
		err  error
	}{
		{"exhausted", &llmretry.Exhausted{Attempts: attempts}},
		{"truncated", &llmretry.Truncated{Exhausted: llmretry.Exhausted{Attempts: attempts}}},
		{"timed_out", &llmretry.TimedOut{Exhausted: llmretry.Exhausted{Attempts: attempts}}},
		{"cancelled", &llmretry.Cancelled{Attempts: attempts, Cause: errors.New("user left")}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			lv, ok := tc.err.(slog.LogValuer)
			if !ok {
				t.Fatalf("%T does not implement slog.LogValuer", tc.err)
			}
			if k := lv.LogValue().Kind(); k != slog.KindGroup {
				t.Errorf("LogValue().Kind() = %v, want Group", k)
			}
			var buf bytes.Buffer
			slog.New(slog.NewJSONHandler(&buf, nil)).Info("chain failed", "err", tc.err)
			var line struct {
				Err map[string]any `json:"err"`
			}
			if err := json.Unmarshal(buf.Bytes(), &line); err != nil {
				t.Fatalf("slog JSON output %s: %v", buf.Bytes(), err)
			}
			if line.Err == nil {
				t.Fatalf("slog JSON output %s, want err as an object of fields", buf.Bytes())
			}
			// Every attempt is in the structured record, as fields.
			for _, want := range []string{`"gpt-4o"`, `"claude"`, `"http 503"`, `"timeout"`} {
				if !strings.Contains(buf.String(), want) {
					t.Errorf("slog output = %s, want it to contain %s", buf.String(), want)
				}
			}
			if tc.name == "cancelled" && !strings.Contains(buf.String(), "user left") {
				t.Errorf("slog output = %s, want the cause", buf.String())
			}
		})
	}
}

// What MarshalJSON writes, UnmarshalJSON reads back exactly: every field,
// every Duration (negative ones and the extremes included), a Kind
// without an error, a success's status.
func TestAttemptJSONExact(t *testing.T) {
	start := time.Date(2025, 3, 1, 12, 0, 0, 250_000_001, time.FixedZone("", -(3*60+30)*60))
	tests := []struct {
		name string
		a    llmretry.Attempt
	}{
		{"negative_durations", llmretry.Attempt{Model: "m", Try: 1, Kind: llmretry.KindTransient, Err: errors.New("x"), Start: start, Elapsed: -1, RetryAfter: -1500 * time.Microsecond, RetryIn: -time.Hour}},
		{"extremes", llmretry.Attempt{Model: "m", Try: 1, Kind: llmretry.KindTimeout, Err: errors.New("x"), Elapsed: math.MinInt64, RetryAfter: math.MaxInt64, RetryIn: 1}},
		{"kind_without_error", llmretry.Attempt{Model: "m", Try: 1, Kind: llmretry.KindTruncated}},
		{"success_with_status", llmretry.Attempt{Model: "m", Try: 1, Status: 200, Start: start}},
		{"skip", llmretry.Attempt{Backend: 2, Model: "m", Try: 3, Kind: llmretry.KindTransient, RetryAfter: 29*time.Second + 1, Next: llmretry.NextFailOver, Why: llmretry.WhyBreaker, Skipped: true}},
		{"outside_the_constants", llmretry.Attempt{Model: "m", Try: 1, Kind: llmretry.Kind(200), Next: llmretry.NextStop, Why: "odd"}},
		{"negative_ints", llmretry.Attempt{Backend: -1, Model: "m", Try: math.MinInt64, Status: -1, Err: errors.New("")}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			data, err := json.Marshal(tc.a)
			if err != nil {
				t.Fatalf("json.Marshal() error = %v", err)
			}
			var got llmretry.Attempt
			if err := json.Unmarshal(data, &got); err != nil {
				t.Fatalf("json.Unmarshal(%s) error = %v", data, err)
			}
			if diff := cmp.Diff(tc.a, got, errorsByMessage, sameOffset); diff != "" {
				t.Errorf("round trip of %s (-want +got):\n%s", data, diff)
			}
		})
	}
}

// sameOffset compares times by instant and offset, as RFC 3339 keeps them.
var sameOffset = cmp.Comparer(func(x, y time.Time) bool {
	_, xo := x.Zone()
	_, yo := y.Zone()
	return x.Equal(y) && xo == yo
})

// A success's record has no "status": 0 and no kind; a failure's keeps
// both, 0 included, so a dead-letter table's columns stay put.
func TestAttemptJSONStatus(t *testing.T) {
	tests := []struct {
		name string
		a    llmretry.Attempt
		want string // the record's keys up to start
	}{
		{"success", llmretry.Attempt{Model: "m", Try: 1}, `{"backend":0,"model":"m","try":1,"start":`},
		{"success_with_status", llmretry.Attempt{Model: "m", Try: 1, Status: 200}, `{"backend":0,"model":"m","try":1,"status":200,"start":`},
		{"failure_without_status", llmretry.Attempt{Model: "m", Try: 1, Kind: llmretry.KindTransient, Err: errors.New("reset")}, `{"backend":0,"model":"m","try":1,"kind":"transient","status":0,"error":"reset","start":`},
		{"unknown_failure", llmretry.Attempt{Model: "m", Try: 1, Next: llmretry.NextStop}, `{"backend":0,"model":"m","try":1,"kind":"unknown","status":0,"start":`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			data, err := json.Marshal(tc.a)
			if err != nil || !strings.HasPrefix(string(data), tc.want) {
				t.Errorf("json.Marshal() = %s, %v, want it to begin %s", data, err, tc.want)
			}
		})
	}
}

// Milliseconds are read exactly to six fraction digits; a seventh rounds
// half away from zero; a Duration's range bounds them on both sides.
func TestAttemptJSONMillis(t *testing.T) {
	tests := []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"0", 0, true},
		{"-0", 0, true},
		{"1.5", 1500 * time.Microsecond, true},
		{"0.000001", 1, true},
		{"0.0000005", 1, true},
		{"0.00000049999999999999", 0, true},
		{"-0.0000005", -1, true},
		{"1.0000015", 1000002, true},
		{"9223372036854.775807", math.MaxInt64, true},
		{"9223372036854.7758074999", math.MaxInt64, true},
		{"9223372036854.7758075", 0, false},
		{"9223372036854.775808", 0, false},
		{"-9223372036854.775808", math.MinInt64, true},
		{"-9223372036854.7758085", 0, false},
		{"99999999999999999999999", 0, false},
		{"1e3", time.Second, true},
		{"-1E-6", -1, true},
		{"1e300", 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			var a llmretry.Attempt
			err := json.Unmarshal([]byte(`{"retry_in_ms":`+tc.in+`}`), &a)
			if (err == nil) != tc.ok || a.RetryIn != tc.want {
				t.Errorf("retry_in_ms %s: RetryIn = %d, error %v, want %d, ok %t", tc.in, a.RetryIn, err, tc.want, tc.ok)
			}
		})
	}
}

// Decoding errors say "llmretry: decoding attempt:" once, name the field
// and the JSON types, and never an internal Go type.
func TestAttemptJSONDecodeErrors(t *testing.T) {
	tests := []struct {
		in   string
		want string
	}{
		{`{"backend":"1"}`, `llmretry: decoding attempt: field "backend": want a number, got string`},
		{`{"try":1.5}`, `llmretry: decoding attempt: field "try": want an integer, got 1.5`},
		{`{"status":1e400}`, `llmretry: decoding attempt: field "status": want an integer, got 1e400`},
		{`{"backend":99999999999999999999}`, `llmretry: decoding attempt: field "backend": 99999999999999999999 is out of range`},
		{`{"model":5}`, `llmretry: decoding attempt: field "model": want a string, got number`},
		{`{"kind":"sideways"}`, `llmretry: decoding attempt: field "kind": unknown kind "sideways"`},
		{`{"kind":3}`, `llmretry: decoding attempt: field "kind": want a string, got number`},
		{`{"raw_text":["x"]}`, `llmretry: decoding attempt: field "raw_text": want a string, got array`},
		{`{"start":"yesterday"}`, `llmretry: decoding attempt: field "start": want an RFC 3339 time, got "yesterday"`},
		{`{"start":0}`, `llmretry: decoding attempt: field "start": want an RFC 3339 time, got number`},
		{`{"elapsed_ms":"5"}`, `llmretry: decoding attempt: field "elapsed_ms": want a number of milliseconds, got string`},
		{`{"retry_in_ms":1e300}`, `llmretry: decoding attempt: field "retry_in_ms": 1e300 milliseconds is out of range`},
		{`{"try":1.000000000000000000000000000000000000000000001}`, `llmretry: decoding attempt: field "try": want an integer, got 1.00000000000000000000000000000000000000...`},
		{`{"delivered":1}`, `llmretry: decoding attempt: field "delivered": want true or false, got number`},
		{`[1, 2]`, `llmretry: decoding attempt: want an object, got array`},
		{`{"backend":`, `llmretry: decoding attempt: unexpected end of JSON input`},
		{`{"error":"Bearer sk-Zq81Lw02Xe93Rt64Yu75Io86", "kind":"sk-Zq81Lw02Xe93Rt64Yu75Io86"}`, `llmretry: decoding attempt: field "kind": unknown kind "REDACTED"`},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			var a llmretry.Attempt
			if err := a.UnmarshalJSON([]byte(tc.in)); err == nil || err.Error() != tc.want {
				t.Errorf("UnmarshalJSON(%s) error = %v, want %s", tc.in, err, tc.want)
			}
			// Through encoding/json, inside a dead-letter record, the text
			// is the same (a syntax error aside: encoding/json finds it
			// before it calls UnmarshalJSON).
			if !json.Valid([]byte(tc.in)) {
				return
			}
			var recs struct{ Attempts []llmretry.Attempt }
			if err := json.Unmarshal([]byte(`{"Attempts":[`+tc.in+`]}`), &recs); err == nil || err.Error() != tc.want {
				t.Errorf("json.Unmarshal(record with %s) error = %v, want %s", tc.in, err, tc.want)
			}
		})
	}
	// A failed decoding leaves the attempt as it was.
	a := llmretry.Attempt{Model: "kept", Try: 4}
	if err := a.UnmarshalJSON([]byte(`{"model":"new","try":"x"}`)); err == nil || a.Model != "kept" || a.Try != 4 {
		t.Errorf("UnmarshalJSON(bad) = %v, attempt %+v, want an error and the attempt unchanged", err, a)
	}
}

// A start whose year RFC 3339 cannot write is refused by MarshalJSON, and
// its text by UnmarshalJSON.
func TestAttemptJSONStartRange(t *testing.T) {
	for _, year := range []int{-1, 10000} {
		a := llmretry.Attempt{Model: "m", Try: 1, Start: time.Date(year, 1, 1, 0, 0, 0, 0, time.UTC)}
		if data, err := json.Marshal(a); err == nil || !strings.Contains(err.Error(), `llmretry: encoding attempt: field "start": year outside of range [0,9999]`) {
			t.Errorf("json.Marshal(year %d) = %s, %v, want the start refused", year, data, err)
		}
		in := `{"start":"` + a.Start.Format(time.RFC3339Nano) + `"}`
		var back llmretry.Attempt
		if err := back.UnmarshalJSON([]byte(in)); err == nil {
			t.Errorf("UnmarshalJSON(%s) = nil error, want the start refused", in)
		}
	}
	// An offset RFC 3339 cannot write is written in UTC: the instant stays.
	odd := time.Date(1900, 1, 1, 0, 0, 0, 0, time.FixedZone("LMT", 19*60+32))
	data, err := json.Marshal(llmretry.Attempt{Start: odd})
	var back llmretry.Attempt
	if err != nil || json.Unmarshal(data, &back) != nil || !back.Start.Equal(odd) {
		t.Errorf("round trip of a start at offset +00:19:32 = %s, %v, start %v, want the instant %v", data, err, back.Start, odd)
	}
}

// Every record the chain can produce decodes to itself, the longest waits
// included.
func TestAttemptJSONRoundTripsExtremes(t *testing.T) {
	const maxDur = time.Duration(math.MaxInt64)
	start := time.Date(2026, 11, 30, 9, 0, 0, 123456789, time.UTC)
	tests := []struct {
		name string
		a    llmretry.Attempt
	}{
		{"longest_retry_in", llmretry.Attempt{Model: "a", Try: 1, Kind: llmretry.KindTransient, Status: 429, Err: errors.New("slow down"), Start: start, Elapsed: 1, RetryAfter: maxDur, Next: llmretry.NextRetry, RetryIn: maxDur}},
		{"longest_elapsed", llmretry.Attempt{Model: "a", Try: 2, Kind: llmretry.KindTimeout, Err: errors.New("slow"), Start: start, Elapsed: maxDur, Next: llmretry.NextStop, Why: llmretry.WhyDeadline}},
		{"odd_nanoseconds", llmretry.Attempt{Model: "a", Try: 3, Kind: llmretry.KindParse, RawText: ptr(""), Err: errors.New("bad json"), Start: start, Elapsed: 123456789, RetryAfter: 1, Next: llmretry.NextRetry, RetryIn: 987654321}},
		{"success", llmretry.Attempt{Backend: 1, Model: "b", Try: 1, Start: start, Elapsed: 999999, Delivered: true}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b, err := json.Marshal(tc.a)
			if err != nil {
				t.Fatalf("json.Marshal() error = %v", err)
			}
			var got llmretry.Attempt
			if err := json.Unmarshal(b, &got); err != nil {
				t.Fatalf("json.Unmarshal(%s) error = %v", b, err)
			}
			if diff := cmp.Diff(tc.a, got, cmp.Comparer(sameMessage), cmpopts.IgnoreUnexported(llmretry.Attempt{})); diff != "" {
				t.Errorf("round trip of %s (-want +got):\n%s", b, diff)
			}
		})
	}
}

// The chain itself makes the longest RetryIn: no MaxWait and a retry-after
// date in 9999. Its record, as OnAttempt sees it, decodes to itself.
func TestDoLongestWaitRecordRoundTrips(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		h := http.Header{}
		h.Set("Retry-After", "Fri, 31 Dec 9999 23:59:59 GMT")
		var seen []llmretry.Attempt
		c := &chain{
			Backends: []backend{{Model: "a", Call: newFake("a", always(llmretry.StatusFailure(429, h, nil))).Call, Retry: llmretry.Policy{Waits: []time.Duration{ms}, MaxWait: -1}}},
			OnAttempt: func(_ context.Context, at llmretry.Attempt) {
				seen = append(seen, at)
				cancel() // no need to wait for the year 2292
			},
		}
		c.Do(ctx, "hi")
		if len(seen) != 1 || seen[0].RetryIn != math.MaxInt64 {
			t.Fatalf("OnAttempt saw %v, want one attempt with the longest RetryIn", seen)
		}
		b, err := json.Marshal(seen[0])
		if err != nil {
			t.Fatalf("json.Marshal() error = %v", err)
		}
		var got llmretry.Attempt
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatalf("json.Unmarshal(%s) error = %v", b, err)
		}
		if diff := cmp.Diff(seen[0], got, cmp.Comparer(sameMessage), cmpopts.IgnoreUnexported(llmretry.Attempt{})); diff != "" {
			t.Errorf("round trip of %s (-want +got):\n%s", b, diff)
		}
	})
}

// Called directly, not through encoding/json, UnmarshalJSON still refuses
// text that only begins like null.
func TestAttemptUnmarshalJSONNotQuiteNull(t *testing.T) {
	for _, in := range []string{"nope", "nul", "nulls"} {
		var a llmretry.Attempt
		if err := a.UnmarshalJSON([]byte(in)); err == nil {
			t.Errorf("UnmarshalJSON(%q) = nil, want an error", in)
		}
	}
	var a llmretry.Attempt
	if err := a.UnmarshalJSON([]byte(" null ")); err != nil {
		t.Errorf("UnmarshalJSON(%q) = %v, want nil", " null ", err)
	}
}

// A skip for pacing says so: the breaker was not opened by failures.
func TestAttemptStringPacedSkip(t *testing.T) {
	a := llmretry.Attempt{Backend: 0, Model: "gpt-4o", Try: 1, Kind: llmretry.KindTransient, Skipped: true,
		Next: llmretry.NextFailOver, Why: llmretry.WhyPaced}
	want := "[backend 0 gpt-4o try 1] skipped: paced by the provider's rate limits (failing over: paced)"
	if got := a.String(); got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
}
