module github.com/llmretry/llmretry

go 1.25

require github.com/google/go-cmp v0.7.0
