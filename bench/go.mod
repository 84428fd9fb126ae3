module github.com/llmretry/llmretry/bench

go 1.26.0

require (
	github.com/avast/retry-go/v4 v4.7.0
	github.com/avast/retry-go/v5 v5.1.1
	github.com/cenkalti/backoff/v5 v5.0.3
	github.com/cenkalti/backoff/v7 v7.0.3
	github.com/failsafe-go/failsafe-go v0.9.8
	github.com/llmretry/llmretry v0.0.0
	github.com/openai/openai-go/v3 v3.98.0
	github.com/sethvargo/go-retry v0.5.0
)

require (
	github.com/bits-and-blooms/bitset v1.24.4 // indirect
	github.com/coder/websocket v1.8.15 // indirect
	github.com/influxdata/tdigest v0.0.1 // indirect
	github.com/tidwall/gjson v1.20.0 // indirect
	github.com/tidwall/match v1.1.1 // indirect
	github.com/tidwall/pretty v1.2.1 // indirect
	github.com/tidwall/sjson v1.2.5 // indirect
	gonum.org/v1/gonum v0.16.0 // indirect
)

replace github.com/llmretry/llmretry => ../
