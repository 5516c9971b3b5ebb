package integration_test

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"go.yaml.in/yaml/v3"

	"github.com/ratebudget/ratebudget/middleware/policy"
)

// schemaPath is the policy file's JSON Schema, as the repository ships it.
const schemaPath = "../middleware/policy/policy.schema.json"

func compilePolicySchema(t *testing.T) *jsonschema.Schema {
	t.Helper()
	data, err := os.ReadFile(schemaPath)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource("policy.schema.json", doc); err != nil {
		t.Fatal(err)
	}
	s, err := c.Compile("policy.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// yamlAsJSON is a YAML document as the JSON value a schema validator reads.
func yamlAsJSON(t *testing.T, src []byte) any {
	t.Helper()
	var v any
	if err := yaml.Unmarshal(src, &v); err != nil {
		t.Fatal(err)
	}
	js, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	out, err := jsonschema.UnmarshalJSON(bytes.NewReader(js))
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// shippedPolicies are the policy files the repository ships: the examples and golden
// files of package policy, the demo's, and every yaml block of docs/POLICY.md.
func shippedPolicies(t *testing.T) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	for _, pattern := range []string{"../middleware/policy/testdata/*.yaml", "../cmd/demo-server/*.yaml"} {
		paths, err := filepath.Glob(pattern)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range paths {
			if strings.HasPrefix(filepath.Base(p), "bad-") {
				continue
			}
			data, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			out[p] = data
		}
	}
	doc, err := os.ReadFile("../docs/POLICY.md")
	if err != nil {
		t.Fatal(err)
	}
	for i, m := range regexp.MustCompile("(?s)```yaml\n(.*?)```").FindAllSubmatch(doc, -1) {
		out["docs/POLICY.md block "+string(rune('1'+i))] = m[1]
	}
	return out
}

// TestPolicySchemaShippedFiles validates every policy file the repository ships against
// the schema, and parses each with package policy: the two agree on them.
func TestPolicySchemaShippedFiles(t *testing.T) {
	s := compilePolicySchema(t)
	files := shippedPolicies(t)
	if len(files) < 5 {
		t.Fatalf("found %d policy files, want the examples, the golden files and the demo's", len(files))
	}
	for name, src := range files {
		if err := s.Validate(yamlAsJSON(t, src)); err != nil {
			t.Errorf("%s: schema: %v", name, err)
		}
		if _, err := policy.Parse(name, src); err != nil {
			t.Errorf("%s: Parse: %v", name, err)
		}
	}
}

// TestPolicySchemaRefuses holds that the schema refuses what the parser refuses for its
// shape: an unknown field, a wrong type, a negative limit, a calendar rule with a window,
// a client_ip section whose options do not go together.
func TestPolicySchemaRefuses(t *testing.T) {
	s := compilePolicySchema(t)
	const head = "rules:\n  - name: a\n    identity: ip\n"
	for name, src := range map[string]string{
		"unknown_field":    head + "    time: {limit: 5, window: 1m, limt: 4}\n",
		"wrong_type":       head + "    time: {limit: abc, window: 1m}\n",
		"negative_limit":   head + "    time: {limit: -5, window: 1m}\n",
		"calendar_window":  head + "    time: {type: calendar, limit: 5, period: day, window: 24h}\n",
		"no_time":          head,
		"bad_identity":     "rules:\n  - {name: a, identity: cookie, unlimited: true}\n",
		"unknown_top":      head + "    unlimited: true\nrule: []\n",
		"plan_bad_limit":   head + "    unlimited: true\nplans:\n  free: {a: {limit: 0}}\n",
		"override_no_key":  head + "    unlimited: true\noverrides:\n  acme: {rules: {}}\n",
		"period_on_fixed":  head + "    time: {limit: 5, window: 1m, period: day}\n",
		"window_not_a_dur": head + "    time: {limit: 5, window: 60}\n",
		"header_untrusted": head + "    unlimited: true\nclient_ip: {header: X-Forwarded-For}\n",
		"proxies_no_hdr":   head + "    unlimited: true\nclient_ip: {trusted_proxies: [10.0.0.0/8]}\n",
		"require_no_hdr":   head + "    unlimited: true\nclient_ip: {require_forwarding: true}\n",
		"no_proxies":       head + "    unlimited: true\nclient_ip: {trusted_proxies: [], header: X-Forwarded-For}\n",
		"ipv4_prefix_33":   head + "    unlimited: true\nclient_ip: {ipv4_prefix: 33}\n",
		"ipv6_prefix_0":    head + "    unlimited: true\nclient_ip: {ipv6_prefix: 0}\n",
		"client_ip_field":  head + "    unlimited: true\nclient_ip: {trusted: [10.0.0.0/8]}\n",
	} {
		if err := s.Validate(yamlAsJSON(t, []byte(src))); err == nil {
			t.Errorf("%s: the schema accepts\n%s", name, src)
		}
		if _, err := policy.Parse("p.yaml", []byte(src)); err == nil {
			t.Errorf("%s: Parse accepts\n%s", name, src)
		}
	}
}
