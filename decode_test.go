package llmretry_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/llmretry/llmretry"
)

// causeOf returns the Cause of a TimedOut or Cancelled, or nil.
func causeOf(err error) error {
	switch e := err.(type) {
	case *llmretry.TimedOut:
		return e.Cause
	case *llmretry.Cancelled:
		return e.Cause
	}
	return nil
}

// diffDecoded returns how got, decoded from the JSON of want, differs from
// what DecodeError promises: the same type, each record as its JSON keeps
// it (the error a plain one carrying the redacted text), the cause's
// redacted text, and the same advice. "" when it is as promised.
func diffDecoded(want, got error) string {
	if fmt.Sprintf("%T", want) != fmt.Sprintf("%T", got) {
		return fmt.Sprintf("type %T, want %T", got, want)
	}
	wantRecords := chainRecords(want)
	gotRecords := chainRecords(got)
	var b strings.Builder
	if len(wantRecords) != len(gotRecords) {
		fmt.Fprintf(&b, "%d records, want %d\n", len(gotRecords), len(wantRecords))
	} else {
		for i := range wantRecords {
			if d := diffAttempt(wantRecord(wantRecords[i]), gotRecords[i]); d != "" {
				fmt.Fprintf(&b, "record %d (-want +got):\n%s", i, d)
			}
		}
	}
	wantCause, gotCause := "", ""
	if c := causeOf(want); c != nil {
		wantCause = jsonString(llmretry.Redact(c.Error()))
	}
	if c := causeOf(got); c != nil {
		gotCause = c.Error()
	}
	if wantCause != gotCause {
		fmt.Fprintf(&b, "cause %q, want %q\n", gotCause, wantCause)
	}
	if w, g := llmretry.RetryItem(want), llmretry.RetryItem(got); w != g {
		fmt.Fprintf(&b, "RetryItem = %v, want %v\n", g, w)
	}
	// The advice counts from now: compare it only when the original's
	// was the same before and after the decoded one's.
	w1, wok1 := llmretry.RetryItemAfter(want)
	g, gok := llmretry.RetryItemAfter(got)
	w2, wok2 := llmretry.RetryItemAfter(want)
	if w1 == w2 && wok1 == wok2 && (g != w1 || gok != wok1) {
		fmt.Fprintf(&b, "RetryItemAfter = %v, %v, want %v, %v\n", g, gok, w1, wok1)
	}
	return b.String()
}

// Each of the four errors, as real Do calls against fake backends leave
// them, decodes from its JSON back into its type, with its records, its
// cause's text, its advice (RetryItemAfter exactly, in virtual time) and
// its message; encoded again, it is the same JSON.
func TestDecodeErrorFromDo(t *testing.T) {
	const s = time.Second
	overloaded := llmretry.StatusFailure(http.StatusServiceUnavailable, http.Header{"Retry-After": {"30"}}, errors.New("overloaded, key sk-Zq81Lw02Xe93Rt64Yu75Io86"))
	limited := llmretry.StatusFailure(http.StatusTooManyRequests, http.Header{"Retry-After": {"20"}}, errors.New("rate limited"))
	cut := llmretry.Truncation("The answer is")
	cut.Usage = &llmretry.Usage{InputTokens: 12, OutputTokens: 256}
	tests := []struct {
		name     string
		calls    []func(context.Context, string) (string, error)
		timeout  time.Duration
		cause    error // the caller's context ends with it after 5s
		deadline bool  // as a deadline, not a cancellation
		wantType any
	}{
		{name: "exhausted_with_retry_after", calls: calls(answerWith(s, overloaded), answerWith(s, limited)), wantType: new(*llmretry.Exhausted)},
		{name: "exhausted_rejected", calls: calls(answerWith(s, status(400, 0, false)), answerWith(s, llmretry.Refusal("finish_reason content_filter"))), wantType: new(*llmretry.Exhausted)},
		{name: "truncated", calls: calls(answerWith(s, overloaded), answerWith(s, cut)), wantType: new(*llmretry.Truncated)},
		{name: "timed_out", calls: calls(answerWith(time.Hour, nil)), timeout: 2 * s, wantType: new(*llmretry.TimedOut)},
		{name: "timed_out_cause", calls: calls(answerWith(time.Hour, nil)), cause: errors.New("the request's budget ran out"), deadline: true, wantType: new(*llmretry.TimedOut)},
		{name: "cancelled_cause", calls: calls(answerWith(s, overloaded), answerWith(time.Hour, nil)), cause: errors.New("shutting down: Bearer abc.def"), wantType: new(*llmretry.Cancelled)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				chain := &llmretry.Chain[string, string]{}
				for i, call := range tc.calls {
					chain.Backends = append(chain.Backends, llmretry.Backend[string, string]{Model: fmt.Sprintf("m%d", i), Call: call, Timeout: tc.timeout})
				}
				ctx := context.Background()
				switch {
				case tc.cause != nil && tc.deadline:
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeoutCause(ctx, 5*s, tc.cause)
					defer cancel()
				case tc.cause != nil:
					var cancel context.CancelCauseFunc
					ctx, cancel = context.WithCancelCause(ctx)
					defer cancel(nil)
					time.AfterFunc(5*s, func() { cancel(tc.cause) })
				}
				_, err := chain.Do(ctx, "question")
				if !errors.As(err, tc.wantType) {
					t.Fatalf("Do() error = %T, want %T", err, tc.wantType)
				}
				data, jerr := json.Marshal(err)
				if jerr != nil {
					t.Fatalf("json.Marshal(%T) error: %v", err, jerr)
				}
				got, derr := llmretry.DecodeError(data)
				if derr != nil {
					t.Fatalf("DecodeError(%s) error: %v", data, derr)
				}
				if d := diffDecoded(err, got); d != "" {
					t.Errorf("DecodeError(json.Marshal(%T)) differs:\n%s", err, d)
				}
				if got.Error() != err.Error() {
					t.Errorf("decoded Error() =\n%s\nwant\n%s", got, err)
				}
				again, jerr := json.Marshal(got)
				if jerr != nil || string(again) != string(data) {
					t.Errorf("json.Marshal(decoded) = %s, %v; want the JSON it came from:\n%s", again, jerr, data)
				}
			})
		})
	}
}

// Each type's UnmarshalJSON reads its own outcome and refuses another;
// null changes nothing, as for any json.Unmarshaler.
func TestErrorUnmarshalJSON(t *testing.T) {
	records := map[string]string{
		"exhausted": `{"outcome":"exhausted","attempts":[{"backend":0,"model":"m","try":1,"kind":"transient","status":503,"error":"http 503"}]}`,
		"truncated": `{"outcome":"truncated","attempts":[{"backend":0,"model":"m","try":1,"kind":"truncated","raw_text":"The"}]}`,
		"timed_out": `{"outcome":"timed_out","cause":"budget","attempts":[]}`,
		"cancelled": `{"outcome":"cancelled","cause":"shutting down"}`,
	}
	targets := map[string]func() json.Unmarshaler{
		"exhausted": func() json.Unmarshaler { return new(llmretry.Exhausted) },
		"truncated": func() json.Unmarshaler { return new(llmretry.Truncated) },
		"timed_out": func() json.Unmarshaler { return new(llmretry.TimedOut) },
		"cancelled": func() json.Unmarshaler { return new(llmretry.Cancelled) },
	}
	for target, newTarget := range targets {
		for outcome, data := range records {
			t.Run(target+"_from_"+outcome, func(t *testing.T) {
				v := newTarget()
				err := json.Unmarshal([]byte(data), v)
				if outcome != target {
					want := fmt.Sprintf(`llmretry: decoding error record: outcome %q, want %q (DecodeError reads any outcome)`, outcome, target)
					if err == nil || err.Error() != want {
						t.Errorf("json.Unmarshal() error = %v, want %q", err, want)
					}
					if d := cmp.Diff(newTarget(), v); d != "" {
						t.Errorf("a failed decoding changed the error (-want +got):\n%s", d)
					}
					return
				}
				if err != nil {
					t.Fatalf("json.Unmarshal() error = %v", err)
				}
				want, derr := llmretry.DecodeError([]byte(data))
				if derr != nil {
					t.Fatal(derr)
				}
				if d := diffDecoded(want, v.(error)); d != "" {
					t.Errorf("UnmarshalJSON differs from DecodeError:\n%s", d)
				}
			})
		}
	}
	var e llmretry.Exhausted
	if err := json.Unmarshal([]byte(records["exhausted"]), &e); err != nil {
		t.Fatal(err)
	}
	before := len(e.Attempts)
	if err := e.UnmarshalJSON([]byte(" null ")); err != nil || len(e.Attempts) != before {
		t.Errorf("UnmarshalJSON(null) = %v, %d records; want nil, the %d it had", err, len(e.Attempts), before)
	}
}

// A record that is not one of the chain's errors is refused with an error
// that says what was wrong, never a panic; null is a nil error.
func TestDecodeErrorBadInput(t *testing.T) {
	const prefix = "llmretry: decoding error record: "
	tests := []struct {
		name string
		in   string
		want string // after the prefix
	}{
		{"empty", ``, "unexpected end of JSON input"},
		{"not_json", `outcome: exhausted`, "invalid character 'o' looking for beginning of value"},
		{"cut_off", `{"outcome":"exhausted","attempts":[`, "unexpected end of JSON input"},
		{"array", `[{"outcome":"exhausted"}]`, "want an object, got array"},
		{"string", `"exhausted"`, "want an object, got string"},
		{"no_outcome", `{"error":"llmretry: exhausted"}`, `no "outcome" key`},
		{"null_outcome", `{"outcome":null}`, `no "outcome" key`},
		{"outcome_number", `{"outcome":3}`, `field "outcome": want a string, got number`},
		{"unknown_outcome", `{"outcome":"gave_up"}`, `unknown outcome "gave_up"`},
		{"attempts_object", `{"outcome":"exhausted","attempts":{}}`, `field "attempts": want an array, got object`},
		{"attempt_null", `{"outcome":"exhausted","attempts":[{},null]}`, `attempts[1]: want an object, got null`},
		{"attempt_bad_kind", `{"outcome":"truncated","attempts":[{"kind":"fatal"}]}`, `attempts[0]: field "kind": unknown kind "fatal"`},
		{"attempt_bad_start", `{"outcome":"timed_out","attempts":[{},{"start":"yesterday"}]}`, `attempts[1]: field "start": want an RFC 3339 time, got "yesterday"`},
		{"cause_number", `{"outcome":"cancelled","cause":1}`, `field "cause": want a string, got number`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := llmretry.DecodeError([]byte(tc.in))
			if err == nil || err.Error() != prefix+tc.want || got != nil {
				t.Errorf("DecodeError(%q) = %v, %v; want nil, %q", tc.in, got, err, prefix+tc.want)
			}
		})
	}
	if got, err := llmretry.DecodeError([]byte("null")); got != nil || err != nil {
		t.Errorf("DecodeError(null) = %v, %v, want nil, nil", got, err)
	}
	// Keys the writer derives from the records, and unknown keys, are not
	// read; a cause on an outcome that has none is not either.
	got, err := llmretry.DecodeError([]byte(`{"outcome":"exhausted","item_retryable":"maybe","error":5,"usage":[],"cause":"x","new_key":{}}`))
	if e, ok := got.(*llmretry.Exhausted); err != nil || !ok || len(e.Attempts) != 0 {
		t.Errorf("DecodeError(derived keys of any type) = %#v, %v; want an *Exhausted with no records", got, err)
	}
}

// FuzzDecodeError checks DecodeError on two fronts. Bytes from a damaged
// or hostile record never make it panic; when they decode, the error
// encodes, and that encoding decodes to the same error and encodes the
// same again; when they do not, the error reads as documented. And each
// of the four errors, built from fuzzed attempts and causes, decodes back
// from its JSON as promised: its type, its records as their JSON keeps
// them, its cause's text and its advice.
func FuzzDecodeError(f *testing.F) {
	f.Add([]byte(`{"outcome":"exhausted","item_retryable":true,"error":"x","usage_unknown":1,"attempts":[{"backend":0,"model":"m","try":1,"kind":"transient","status":503,"error":"http 503","start":"2026-12-02T04:53:49.662108745Z","elapsed_ms":180.5,"retry_after_ms":2000,"next":"fail_over","why":"waits_used","retry_in_ms":0,"delivered":false}]}`),
		[]byte{3, 1, 0, 5, 4, 1, 9, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 2, 0, 3, 1, 0, 1, 5, 3, 2}, uint8(0), "gpt|http 400: context too long|sk-Zq81Lw02Xe93Rt64Yu75Io86", "", false)
	f.Add([]byte(`{"outcome":"cancelled","cause":"Bearer abc","attempts":null}`),
		[]byte{2, 0, 0, 0, 3, 3, 1, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2}, uint8(3), "m|partial \xff output", "custom\nsummary https://u:p@h/", true)
	f.Add([]byte(`{"outcome":"truncated","attempts":[{"kind":"truncated","raw_text":"","skipped":true}]}`),
		[]byte{1, 0, 0, 0, 3, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2}, uint8(1), "m|length", "", false)
	f.Add([]byte(`{"outcome":"timed_out","cause":"","attempts":[{"start":"0000-01-01T00:00:00+00:01","elapsed_ms":-9223372036854.775808}]}`),
		[]byte{4, 2, 1, 1, 2, 7, 1, 0, 255, 255, 255, 255, 255, 255, 255, 255, 1, 1, 1, 1, 1, 1, 1, 1}, uint8(2), "a|b|c", "budget", true)
	f.Add([]byte(`{"outcome":"exhausted","attempts":[{"kind":"kind(200)"},{"why":"refused","kind":"refused","next":"stop"}]}`),
		[]byte{6, 1, 1, 1, 3, 5, 2, 1, 2, 2, 1, 4, 4, 3, 1, 3, 2, 2, 8, 6}, uint8(4), "\x00|\"|\\u0026key=v", "", false)
	f.Add([]byte(`{"outcome":"gave_up"}`), []byte{}, uint8(0), "", "", false)
	f.Add([]byte(`[`), []byte{}, uint8(0), "", "", false)
	f.Fuzz(func(t *testing.T, data, choices []byte, which uint8, texts, causeText string, hasCause bool) {
		// Bytes from a damaged or hostile record.
		if got, err := llmretry.DecodeError(data); err != nil {
			msg := err.Error()
			const prefix = "llmretry: decoding error record: "
			if got != nil || !strings.HasPrefix(msg, prefix) || strings.Contains(msg, "\n") {
				t.Errorf("DecodeError(%q) = %v, %q; want nil and one line starting %q", data, got, msg, prefix)
			}
			for _, internal := range []string{"errorRecord", "RawMessage", "Go value", "Go struct", "map["} {
				if strings.Contains(msg, internal) {
					t.Errorf("DecodeError(%q) error = %q names %q, an internal type", data, msg, internal)
				}
			}
		} else if got != nil {
			enc, jerr := json.Marshal(got)
			if jerr != nil {
				t.Fatalf("json.Marshal(%T) of a decoded error: %v", got, jerr)
			}
			again, derr := llmretry.DecodeError(enc)
			if derr != nil {
				t.Fatalf("DecodeError(%s) of an encoded error: %v", enc, derr)
			}
			if d := diffDecoded(got, again); d != "" {
				t.Errorf("DecodeError(json.Marshal(decoded)) differs, encoding %s:\n%s", enc, d)
			}
			if enc2, _ := json.Marshal(again); string(enc2) != string(enc) {
				t.Errorf("encoding not stable:\nfirst  %s\nsecond %s", enc, enc2)
			}
		}

		// One of the four errors, built from fuzzed attempts.
		r := fuzzBytes(choices)
		attempts := fuzzAttempts(&r, texts)
		var cause error
		if hasCause {
			cause = fmt.Errorf("caller: %s", causeText)
		}
		var err error
		switch which % 5 {
		case 0:
			err = &llmretry.Exhausted{Attempts: attempts}
		case 1:
			err = &llmretry.Truncated{Exhausted: llmretry.Exhausted{Attempts: attempts}}
		case 2:
			err = &llmretry.TimedOut{Exhausted: llmretry.Exhausted{Attempts: attempts}, Cause: cause}
		case 3:
			err = &llmretry.Cancelled{Attempts: attempts, Cause: cause}
		case 4:
			err = llmretry.Exhaust(attempts)
		}
		enc, jerr := json.Marshal(err)
		if jerr != nil {
			t.Fatalf("json.Marshal(%T) error: %v", err, jerr)
		}
		got, derr := llmretry.DecodeError(enc)
		if derr != nil {
			t.Fatalf("DecodeError(%s) error: %v", enc, derr)
		}
		if d := diffDecoded(err, got); d != "" {
			t.Errorf("DecodeError(json.Marshal(%T)) differs, encoding %s:\n%s", err, enc, d)
		}
	})
}
