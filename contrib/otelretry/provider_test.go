package otelretry_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.opentelemetry.io/otel/attribute"

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
		{"gemini", "Gemini-2.5-Pro", "gcp.gen_ai"},
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

// TestProvider checks where gen_ai.provider.name comes from, on every
// span and metric point of a call: Config.Provider's answer, else the
// backend's own Provider (as the adapters set it), else a guess from the
// model's name, else "_OTHER", never left out, since the conventions
// require it.
func TestProvider(t *testing.T) {
	tests := []struct {
		name    string
		model   string // scripted on the server and sent
		backend string // the backend's Provider
		config  func(i int, model string) string
		want    string
	}{
		{name: "guessed", model: "gpt-4o", want: "openai"},
		{name: "unknown_model", model: "llama-3.1-70b", want: "_OTHER"},
		{name: "from_backend", model: "llama-3.1-70b", backend: "groq", want: "groq"},
		{name: "backend_over_guess", model: "gpt-4o", backend: "azure.ai.openai", want: "azure.ai.openai"},
		{name: "config_over_backend", model: "gpt-4o", backend: "openai",
			config: func(int, string) string { return "azure.ai.openai" }, want: "azure.ai.openai"},
		{name: "config_empty", model: "llama-3.1-70b", backend: "groq",
			config: func(int, string) string { return "" }, want: "groq"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := newRig(t, nil)
			r.srv.Script(tc.model, llmretrytest.Answer("Paris."))
			b := r.chat(tc.model)
			b.Provider = tc.backend
			c := otelretry.Instrument(&chain{Backends: []backend{b}}, otelretry.Config{
				TracerProvider: r.tp, MeterProvider: r.mp, Provider: tc.config,
			})
			if _, err := c.Do(context.Background(), "q"); err != nil {
				t.Fatalf("Do() = %v, want nil", err)
			}
			var got []string
			for _, s := range r.spans.GetSpans() {
				if s.InstrumentationScope.Name != scope {
					continue
				}
				set := attribute.NewSet(s.Attributes...)
				v, _ := set.Value("gen_ai.provider.name")
				got = append(got, s.Name+": "+v.AsString())
			}
			for _, p := range points(r.collect(t), scope) {
				_, v, _ := strings.Cut(p.Attrs, "gen_ai.provider.name=")
				v, _, _ = strings.Cut(v, ",")
				got = append(got, p.Metric+": "+v)
			}
			slices.Sort(got)
			name := "chat " + tc.model
			want := []string{
				name + ": " + tc.want, name + ": " + tc.want,
				"gen_ai.client.operation.duration: " + tc.want,
				"gen_ai.client.token.usage: " + tc.want, "gen_ai.client.token.usage: " + tc.want,
				"llmretry.attempts: " + tc.want,
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("gen_ai.provider.name by span and metric point (-want +got):\n%s", diff)
			}
		})
	}
}
