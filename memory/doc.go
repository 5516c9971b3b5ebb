// Package memory is the in-process [ratebudget.Limiter]: budgets kept in this process's
// memory, decided under the same time rules and reported in the same terms as by the
// Redis limiter (package lua), with no I/O.
//
//	lim, err := memory.New(memory.WithMaxBudgets(500_000)) // options are checked here
//	var zero memory.Limiter                                 // ready, with the defaults
//
// A [Limiter] is exact for one process. Processes that each use one have budgets of their
// own; package lua shares one budget between them, and the middleware's local
// fallback divides a rule's limit between a known number of replicas.
//
// [Limiter] reports every check's outcome ([Limiter.AllowEach]) and settles decisions
// ([Limiter.Reserve], [Limiter.Settle], [Limiter.Renew]) as package ratebudget's
// documentation says. It never returns a store error: its decisions, settles and renewals
// fail only on invalid arguments (a *[ratebudget.ConfigError]) or, for a renewal, with
// [ratebudget.ErrLeaseLost].
//
// How budgets are held, swept and evicted, what each costs in memory and time, and how
// to size [WithMaxBudgets]: docs/MEMORY.md. How settling works: docs/SETTLING.md.
package memory
