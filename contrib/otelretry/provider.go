package otelretry

import "strings"

// GuessProvider returns the gen_ai.provider.name of the provider whose
// models are named like model, by its family's prefix: "openai" for
// gpt-*, o1*, o3*, o4* and chatgpt-*, "anthropic" for claude-*,
// "gcp.gen_ai" (the conventions' name for a Google endpoint of either
// kind) for gemini-* and gemma-*, "mistral_ai", "cohere" (command-*),
// "x_ai" (grok-*) and "deepseek". A model written as "provider/model", as
// routers name them, is guessed by the part after the slash. It returns
// "" for a model it does not know. A model's name cannot say who serves
// it (gpt-4o on Azure is "azure.ai.openai"), which is why the backend's
// own Provider, set by the adapters, comes first; [Instrument] guesses
// only for a backend that does not say.
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
	{"gcp.gen_ai", []string{"gemini", "gemma"}},
	{"mistral_ai", []string{"mistral", "mixtral", "codestral", "ministral", "pixtral", "magistral"}},
	{"cohere", []string{"command"}},
	{"x_ai", []string{"grok"}},
	{"deepseek", []string{"deepseek"}},
}

// otherProvider is gen_ai.provider.name for a provider nothing names. The
// attribute is required and the conventions list no value for an unknown
// provider, so it takes the word they use for an unknown value elsewhere
// (error.type, http.request.method).
const otherProvider = "_OTHER"

// providerOf is the provider of backend i, whose model is model and whose
// Provider field says adapter: the Config's answer when it gives one,
// else the backend's own, else a guess from the model, else
// otherProvider.
func providerOf(configured func(i int, model string) string, i int, model, adapter string) string {
	if configured != nil {
		if p := configured(i, model); p != "" {
			return p
		}
	}
	if adapter != "" {
		return adapter
	}
	if p := GuessProvider(model); p != "" {
		return p
	}
	return otherProvider
}
