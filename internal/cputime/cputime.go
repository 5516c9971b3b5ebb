// Package cputime reads the CPU time this process has used, so that a benchmark on a
// shared machine can report CPU time per operation besides wall time.
package cputime
