package llmretrytest_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/llmretry/llmretry"
	"github.com/llmretry/llmretry/llmretrytest"
)

// chatBackend is a backend of the Chat Completions API written on
// net/http alone, as a user might write one, without streaming. fault,
// when not empty, breaks it on purpose:
//
//   - "resend": it sends a request again itself after a 5xx, as an SDK
//     with its own retries on does;
//   - "transient": it calls every error response transient, a 401
//     included.
func chatBackend(srv *llmretrytest.Server, model, fault string) llmretry.Backend[string, llmretry.Completion] {
	call := func(ctx context.Context, q string) (llmretry.Completion, error) {
		body, _ := json.Marshal(map[string]any{
			"model":    model,
			"messages": []map[string]string{{"role": "user", "content": q}},
		})
		var (
			resp *http.Response
			err  error
		)
		for try := 0; ; try++ {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.OpenAIBaseURL()+"chat/completions", bytes.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", "Bearer sk-test-conformance")
			resp, err = http.DefaultClient.Do(req)
			if err != nil {
				return llmretry.Completion{}, causeOf(ctx, err)
			}
			if fault == "resend" && resp.StatusCode >= 500 && try < 2 {
				resp.Body.Close()
				continue
			}
			break
		}
		defer resp.Body.Close()
		llmretry.ReportLimits(ctx, resp.Header)
		data, err := io.ReadAll(resp.Body)
		if err != nil {
			return llmretry.Completion{}, causeOf(ctx, err)
		}
		if resp.StatusCode != http.StatusOK {
			var e struct {
				Error struct{ Type, Code, Message string }
			}
			_ = json.Unmarshal(data, &e)
			f := llmretry.StatusFailure(resp.StatusCode, resp.Header, errors.New(e.Error.Message))
			switch {
			case fault == "transient":
				f.Kind = llmretry.KindTransient
			case e.Error.Code == "insufficient_quota":
				f.Kind = llmretry.KindRejected
			case e.Error.Code == "content_filter":
				f.Kind = llmretry.KindRefused
			}
			return llmretry.Completion{}, f
		}
		var cc struct {
			ID, Model string
			Choices   []struct {
				Message struct {
					Content   string
					ToolCalls []json.RawMessage `json:"tool_calls"`
				}
				FinishReason string `json:"finish_reason"`
			}
			Usage *struct {
				PromptTokens     int64 `json:"prompt_tokens"`
				CompletionTokens int64 `json:"completion_tokens"`
			}
		}
		if err := json.Unmarshal(data, &cc); err != nil || len(cc.Choices) == 0 {
			return llmretry.Completion{}, &llmretry.Failure{Kind: llmretry.KindTransient, Err: errors.New("body does not decode")}
		}
		var usage *llmretry.Usage
		if cc.Usage != nil {
			usage = &llmretry.Usage{InputTokens: cc.Usage.PromptTokens, OutputTokens: cc.Usage.CompletionTokens}
		}
		choice := cc.Choices[0]
		text := choice.Message.Content
		var f *llmretry.Failure
		switch {
		case choice.FinishReason == "":
			f = &llmretry.Failure{Kind: llmretry.KindTransient, Err: errors.New("no finish reason"), RawText: &text}
		case choice.FinishReason == "length":
			f = llmretry.Truncation(text)
		case choice.FinishReason == "content_filter":
			f = llmretry.Refusal("content_filter")
			f.RawText = &text
		case text == "" && len(choice.Message.ToolCalls) == 0:
			f = llmretry.ParseFailure(text, errors.New("no text"))
		}
		if f != nil {
			f.Usage = usage
			return llmretry.Completion{}, f
		}
		if usage != nil {
			llmretry.ReportUsage(ctx, *usage)
		}
		c := llmretry.Completion{ID: cc.ID, Model: cc.Model, Text: text, StopReason: choice.FinishReason, Raw: &cc}
		if usage != nil {
			c.InputTokens, c.OutputTokens = usage.InputTokens, usage.OutputTokens
		}
		if llmretry.Streaming(ctx) {
			llmretry.Emit(ctx, text)
		}
		return c, nil
	}
	return llmretry.Backend[string, llmretry.Completion]{Model: model, Provider: "openai", Call: call}
}

// causeOf is the cause of ctx when err is the transport's report of ctx
// ending, so that a record names the chain's own timeout.
func causeOf(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return errors.Join(err, context.Cause(ctx))
	}
	return err
}

// A backend written on net/http passes the suite.
func TestBackendConformance(t *testing.T) {
	t.Parallel()
	llmretrytest.TestBackend(t, func(srv *llmretrytest.Server, model string) llmretry.Backend[string, llmretry.Completion] {
		return chatBackend(srv, model, "")
	})
}

// brokenEnv names the fault TestBrokenBackend's child process breaks the
// backend with.
const brokenEnv = "LLMRETRYTEST_BROKEN_BACKEND"

// The suite fails a backend that breaks the contract: run in a child
// process (a test cannot watch its own subtests fail and pass), each
// broken backend fails the checks of what it breaks.
func TestBrokenBackend(t *testing.T) {
	if fault := os.Getenv(brokenEnv); fault != "" {
		// The child: the suite against the broken backend, expected to
		// fail.
		llmretrytest.TestBackend(t, func(srv *llmretrytest.Server, model string) llmretry.Backend[string, llmretry.Completion] {
			return chatBackend(srv, model, fault)
		})
		return
	}
	if testing.Short() {
		t.Skip("runs the suite in a child process")
	}
	t.Parallel()
	tests := []struct {
		fault string
		fails []string // subtests that must fail, with what they must say
	}{
		{"resend", []string{
			"--- FAIL: TestBrokenBackend/one_request_per_attempt/held",
			"want one request per attempt",
		}},
		{"transient", []string{
			"--- FAIL: TestBrokenBackend/unauthorized/held",
			`want ["a rejected fail_over not_retryable" "b ok"]`,
		}},
	}
	for _, tc := range tests {
		t.Run(tc.fault, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(os.Args[0], "-test.run=^TestBrokenBackend$", "-test.v")
			cmd.Env = append(os.Environ(), brokenEnv+"="+tc.fault)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("the suite passed a backend broken by %q, want it to fail:\n%s", tc.fault, out)
			}
			for _, want := range tc.fails {
				if !strings.Contains(string(out), want) {
					t.Errorf("the suite's output lacks %q:\n%s", want, out)
				}
			}
		})
	}
}
