module github.com/llmretry/llmretry/examples/fleet

go 1.26.0

require (
	github.com/jackc/pgx/v5 v5.12.0
	github.com/llmretry/llmretry v0.1.0
	github.com/llmretry/llmretry/contrib/pgbreaker v0.1.0
)

// Not published: this module only shows the store at work, and builds
// against the repository's own tree.
replace (
	github.com/llmretry/llmretry => ../..
	github.com/llmretry/llmretry/contrib/pgbreaker => ../../contrib/pgbreaker
)
