// Package pgbreaker provides a store on PostgreSQL for the state of an
// [llmretry.Breaker], so that every process of a fleet shares one
// breaker per backend.
package pgbreaker
