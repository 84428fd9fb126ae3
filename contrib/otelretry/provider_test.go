package otelretry_test

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/llmretry/llmretry/contrib/otelretry"
	"github.com/llmretry/llmretry/llmretrytest"
)

func TestGuessProvider(t *testing.T) {
	tests := []struct {
		name, model, want string
	}{
		{"gpt", "gpt-4o", "openai"},
		{"o_series", "o3-mini", "openai"},
		{"claude", "claude-sonnet-4-5", "anthropic"},
		{"gemini", "Gemini-2.5-Pro", "gcp.gemini"},
		{"router_prefix", "mistralai/mistral-large", "mistral_ai"},
		{"grok", "grok-4", "x_ai"},
		{"unknown", "llama-3.1-70b", ""},
		{"empty", "unknown", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := otelretry.GuessProvider(tc.model); got != tc.want {
				t.Errorf("GuessProvider(%q) = %q, want %q", tc.model, got, tc.want)
			}
		})
	}
}

// TestConfigProvider checks that Config.Provider names each backend's
// provider, in place of the guess, on the call's and the attempts' spans.
func TestConfigProvider(t *testing.T) {
	r := newRig(t, nil)
	r.srv.Script("gpt-4o", llmretrytest.Answer("Paris."))
	c := otelretry.Instrument(&chain{Backends: []backend{r.chat("gpt-4o")}}, otelretry.Config{
		TracerProvider: r.tp, MeterProvider: r.mp,
		Provider: func(i int, model string) string { return "azure.ai.openai" },
	})
	if _, err := c.Do(context.Background(), "q"); err != nil {
		t.Fatalf("Do() = %v, want nil", err)
	}
	got := map[string]string{}
	for _, s := range r.spans.GetSpans() {
		for _, kv := range s.Attributes {
			if kv.Key == "gen_ai.provider.name" {
				got[s.Name] = kv.Value.AsString()
			}
		}
	}
	want := map[string]string{"chat gpt-4o": "azure.ai.openai", "attempt gpt-4o": "azure.ai.openai"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("gen_ai.provider.name by span (-want +got):\n%s", diff)
	}
}
