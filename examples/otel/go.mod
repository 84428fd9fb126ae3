module github.com/llmretry/llmretry/examples/otel

go 1.26.0

require (
	github.com/google/go-cmp v0.7.0
	github.com/llmretry/llmretry v0.1.0
	github.com/llmretry/llmretry/contrib/otelretry v0.1.0
	go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp v0.72.0
	go.opentelemetry.io/otel v1.47.0
	go.opentelemetry.io/otel/sdk v1.47.0
	go.opentelemetry.io/otel/trace v1.47.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/felixge/httpsnoop v1.1.0 // indirect
	github.com/go-logr/logr v1.4.4 // indirect
	github.com/go-logr/stdr v1.2.2 // indirect
	github.com/google/uuid v1.6.0 // indirect
	go.opentelemetry.io/auto/sdk v1.2.1 // indirect
	go.opentelemetry.io/otel/log v1.47.0 // indirect
	go.opentelemetry.io/otel/metric v1.47.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
)

// Not published: this module only shows the instrumentation, and builds
// against the repository's own tree.
replace (
	github.com/llmretry/llmretry => ../..
	github.com/llmretry/llmretry/contrib/otelretry => ../../contrib/otelretry
)
