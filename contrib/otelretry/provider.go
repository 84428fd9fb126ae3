package otelretry

import "strings"

// GuessProvider returns the gen_ai.provider.name of the provider whose
// models are named like model, by its family's prefix: "openai" for
// gpt-*, o1*, o3*, o4* and chatgpt-*, "anthropic" for claude-*,
// "gcp.gemini" for gemini-* and gemma-*, "mistral_ai", "cohere"
// (command-*), "x_ai" (grok-*) and "deepseek". A model written as
// "provider/model", as routers name them, is guessed by the part after the
// slash. It returns "" for a model it does not know, which leaves the
// attribute out: a wrong provider would mislead more than none. A model's
// name cannot say who serves it (gpt-4o on Azure is "azure.ai.openai"):
// set [Config.Provider] to say.
func GuessProvider(model string) string {
	m := strings.ToLower(model)
	if i := strings.LastIndexByte(m, '/'); i >= 0 {
		m = m[i+1:]
	}
	for _, f := range families {
		for _, p := range f.prefixes {
			if strings.HasPrefix(m, p) {
				return f.provider
			}
		}
	}
	return ""
}

// families are the model name prefixes of each provider GuessProvider
// knows.
var families = []struct {
	provider string
	prefixes []string
}{
	{"openai", []string{"gpt-", "o1", "o3", "o4", "chatgpt-"}},
	{"anthropic", []string{"claude"}},
	{"gcp.gemini", []string{"gemini", "gemma"}},
	{"mistral_ai", []string{"mistral", "mixtral", "codestral", "ministral", "pixtral", "magistral"}},
	{"cohere", []string{"command"}},
	{"x_ai", []string{"grok"}},
	{"deepseek", []string{"deepseek"}},
}
