// Package policy reads a rate-limit policy from a YAML file: named rules (whose budget,
// where, which time rule, what is counted), plans and the tenants on them, a tenant's
// own overrides, and which rule replaces which. A program loads the file ([Load],
// [Parse]), and can keep it current while it runs ([Watch]): a valid edit takes effect
// within a second, a bad one is refused with its line, column and field, and the last
// good policy stays in effect.
//
// The format, with a full example, how a request's rules and limits are chosen, and how
// a reload behaves: docs/POLICY.md. policy.schema.json in this directory is the file's
// JSON Schema, for editors and for checks before a deploy.
//
// # Precedence
//
// Every rule whose match holds applies to a request, all in one decision, unless another
// rule that matches the request replaces it (replaces: [name]): a replaced rule is not
// decided at all, so its budget is not touched. A rule marked unlimited, on the plan of
// the request's tenant or for the rule itself, is decided without asking the store. A
// rule in shadow mode (shadow: true, on a plan, or shadow_mode: true for the whole
// file) is decided and observed but never refuses.
//
// # The client's address
//
// identity: ip and match.ip read the client's address as the file's client_ip section
// says, with keyfuncs.ClientIP's options (trusted_proxies, header, require_forwarding,
// ipv4_prefix, ipv6_prefix), built once per policy: behind a load balancer, name its
// ranges and the header it writes, and each client gets its own budget. Without the
// section the client is the connection's peer, the balancer itself.
package policy
