package policy

// The file's shape, as yaml decodes it. Every field is optional to the decoder; what is
// required is checked once decoded (compile.go), so that each problem names its field.
// policy.schema.json describes the same shape; keep the two in step.

// duration is a Go duration in the file ("1m", "1h30m"), parsed once decoded.
type duration string

type file struct {
	Version    int64                           `yaml:"version"`
	ShadowMode bool                            `yaml:"shadow_mode"`
	Rules      []ruleSpec                      `yaml:"rules"`
	Plans      map[string]map[string]limitSpec `yaml:"plans"`
	Tenants    *tenantSpec                     `yaml:"tenants"`
	Overrides  map[string]overrideSpec         `yaml:"overrides"`
	ClientIP   *clientIPSpec                   `yaml:"client_ip"`
}

// clientIPSpec is where identity ip and match.ip read the client's address: each field
// is one of keyfuncs.ClientIP's options.
type clientIPSpec struct {
	TrustedProxies    []string `yaml:"trusted_proxies"`
	Header            string   `yaml:"header"`
	RequireForwarding bool     `yaml:"require_forwarding"`
	IPv4Prefix        *int64   `yaml:"ipv4_prefix"`
	IPv6Prefix        *int64   `yaml:"ipv6_prefix"`
}

type ruleSpec struct {
	Name      string     `yaml:"name"`
	Identity  string     `yaml:"identity"`
	Scope     string     `yaml:"scope"`
	Match     *matchSpec `yaml:"match"`
	Time      *timeSpec  `yaml:"time"`
	Counts    *countSpec `yaml:"counts"`
	Shadow    bool       `yaml:"shadow"`
	Unlimited bool       `yaml:"unlimited"`
	Replaces  []string   `yaml:"replaces"`
}

type matchSpec struct {
	Method  string            `yaml:"method"`
	Path    string            `yaml:"path"`
	Headers map[string]string `yaml:"headers"`
	IP      []string          `yaml:"ip"`
}

type timeSpec struct {
	Type      string   `yaml:"type"`
	Limit     *int64   `yaml:"limit"`
	Window    duration `yaml:"window"`
	Burst     *int64   `yaml:"burst"`
	Period    string   `yaml:"period"`
	Zone      string   `yaml:"zone"`
	WeekStart string   `yaml:"week_start"`
}

type countSpec struct {
	Contract string `yaml:"contract"`
	Estimate int64  `yaml:"estimate"`
	Header   string `yaml:"header"`
}

// limitSpec is a plan's or an override's values for one rule.
type limitSpec struct {
	Limit     *int64   `yaml:"limit"`
	Window    duration `yaml:"window"`
	Burst     *int64   `yaml:"burst"`
	Shadow    bool     `yaml:"shadow"`
	Unlimited bool     `yaml:"unlimited"`
}

type tenantSpec struct {
	Header  string            `yaml:"header"`
	Default string            `yaml:"default"`
	Keys    map[string]string `yaml:"keys"`
}

type overrideSpec struct {
	Key   string               `yaml:"key"`
	Rules map[string]limitSpec `yaml:"rules"`
}
