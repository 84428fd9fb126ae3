package llmretrytest

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestStepString(t *testing.T) {
	t.Parallel()
	tests := []struct {
		step Step
		want string
	}{
		{Step{}, "answer"},
		{Answer("hi"), "answer"},
		{Truncated("hi"), "truncated"},
		{Refuse("hi"), "refused"},
		{ToolCall("get_weather", `{}`).Every(time.Second), "tool call get_weather"},
		{Status(503), "status 503"},
		{Status(429).WithHeader("retry-after", "1").After(time.Second), "status 429"},
		{InsufficientQuota(), "status 429 insufficient_quota"},
		{ContextLengthExceeded(), "status 400 context_length_exceeded"},
		{ContentFilter(), "status 400 content_filter"},
		{Failed("server_error").WithUsageDetails(1, 2), "failed server_error"},
		{StreamError("overloaded_error"), "stream error overloaded_error"},
		{StreamDrop(2), "stream drop 2"},
		{StreamUnfinished(0), "stream unfinished 0"},
		{StreamStall(1).Every(time.Second), "stream stall 1"},
		{StallHeaders(), "stall headers"},
		{Malformed(), "malformed"},
		{Hangup(), "hangup"},
		{Down(), "down"},
		{HugeBody(1 << 30).Every(time.Second), "huge body 1073741824"},
		{EndlessBody(), "endless body"},
		{Trickle(20 * time.Millisecond), "trickle"},
		{PartialHeaders(), "partial headers"},
	}
	for _, tc := range tests {
		if got := tc.step.String(); got != tc.want {
			t.Errorf("String() = %q, want %q", got, tc.want)
		}
	}
}

// Steps are values: deriving one from another leaves the first as it was,
// even when both add headers to a shared base.
func TestStepIsAValue(t *testing.T) {
	t.Parallel()
	base := Status(429).WithHeader("a", "1")
	first := base.WithHeader("b", "2").After(time.Second)
	second := base.WithHeader("c", "3")
	if diff := cmp.Diff([][2]string{{"a", "1"}}, base.headers); diff != "" {
		t.Errorf("base headers (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([][2]string{{"a", "1"}, {"b", "2"}}, first.headers); diff != "" {
		t.Errorf("first headers (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([][2]string{{"a", "1"}, {"c", "3"}}, second.headers); diff != "" {
		t.Errorf("second headers (-want +got):\n%s", diff)
	}
	if base.after != 0 || first.after != time.Second {
		t.Errorf("after: base %v, first %v; want 0, 1s", base.after, first.after)
	}
}

func TestStepPanics(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		make func() Step
		want string
	}{
		{"status_200", func() Step { return Status(200) }, "llmretrytest: Status(200)"},
		{"status_600", func() Step { return Status(600) }, "llmretrytest: Status(600)"},
		{"drop_negative", func() Step { return StreamDrop(-1) }, "llmretrytest: StreamDrop(-1)"},
		{"unfinished_negative", func() Step { return StreamUnfinished(-1) }, "llmretrytest: StreamUnfinished(-1)"},
		{"stall_negative", func() Step { return StreamStall(-2) }, "llmretrytest: StreamStall(-2)"},
		{"huge_negative", func() Step { return HugeBody(-1) }, "llmretrytest: HugeBody(-1)"},
		{"trickle_zero", func() Step { return Trickle(0) }, "llmretrytest: Trickle(0s)"},
		{"trickle_negative", func() Step { return Trickle(-time.Second) }, "llmretrytest: Trickle(-1s)"},
		{"tool_call_no_name", func() Step { return ToolCall("", `{}`) }, "llmretrytest: ToolCall with an empty tool name"},
		{"tool_call_not_json", func() Step { return ToolCall("f", `{"a":`) }, `llmretrytest: ToolCall("f", "{\"a\":")`},
		{"tool_call_not_object", func() Step { return ToolCall("f", `[1]`) }, `llmretrytest: ToolCall("f", "[1]")`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			defer func() {
				msg, _ := recover().(string)
				if !strings.HasPrefix(msg, tc.want) {
					t.Errorf("panic %q, want one starting %q", msg, tc.want)
				}
			}()
			tc.make()
		})
	}
	for _, code := range []int{400, 599} {
		Status(code) // the bounds are allowed
	}
	HugeBody(0)
	Trickle(time.Nanosecond)
}

func TestSplitWords(t *testing.T) {
	t.Parallel()
	tests := []struct {
		text string
		want []string
	}{
		{"", nil},
		{"Hello", []string{"Hello"}},
		{"Hello brave  new\nworld", []string{"Hello ", "brave  ", "new\n", "world"}},
		{" leading", []string{" leading"}},
		{"  two leading words ", []string{"  two ", "leading ", "words "}},
		{"   ", []string{"   "}},
		{"héllo wörld", []string{"héllo ", "wörld"}},
		{"tab\tand\u3000ideographic space", []string{"tab\t", "and\u3000", "ideographic ", "space"}},
	}
	for _, tc := range tests {
		got := splitWords(tc.text)
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("splitWords(%q) (-want +got):\n%s", tc.text, diff)
		}
		if joined := strings.Join(got, ""); joined != tc.text {
			t.Errorf("splitWords(%q) joins to %q", tc.text, joined)
		}
	}
}
