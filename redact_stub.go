package llmretry

// Redact is a stand-in until the real redaction lands.
func Redact(s string) string { return s }
