package policy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Load reads the policy file at path and parses it (see [Parse]); the file's name in
// errors is path as given.
func Load(path string) (*Policy, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(path, data)
}

// Parse parses and validates a policy file's content; name is the file's name in errors.
// A file that is not a valid policy returns a *[Error] naming the line, the column and
// the field at fault: YAML that does not parse, a field of the wrong type, a field the
// format does not know (never ignored), a value out of range (a negative limit, a
// window that is not a duration), a plan, rule or zone that does not exist, or a cycle
// of replaces. The returned Policy is immutable and safe for concurrent use.
func Parse(name string, data []byte) (*Policy, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, syntaxError(name, err)
	}
	if doc.Kind == 0 || len(doc.Content) == 0 {
		return nil, &Error{File: name, Problem: "is empty: a policy has at least a list of rules"}
	}
	w := walker{file: name, pos: map[string]*yaml.Node{}}
	if err := w.walk(doc.Content[0], reflect.TypeFor[file](), ""); err != nil {
		return nil, err
	}
	var f file
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil && !errors.Is(err, io.EOF) {
		return nil, syntaxError(name, err) // the walk above lets nothing through that fails here
	}
	return compile(name, data, &f, w.pos)
}

var yamlLine = regexp.MustCompile(`line (\d+)`)

// syntaxError is the *Error of a yaml error, at the line it names (yaml's messages give
// no column).
func syntaxError(name string, err error) error {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	e := &Error{File: name, Problem: msg}
	if m := yamlLine.FindStringSubmatch(msg); m != nil {
		e.Line, _ = strconv.Atoi(m[1])
		e.Problem = strings.TrimSpace(strings.Replace(msg, m[0]+":", "", 1))
	}
	return e
}

// walker checks a document's nodes against the Go type they decode into, so that a wrong
// type or an unknown field is refused with its line, column and path (the yaml decoder's
// own errors give a line only, and no path). It records each field's node by path for
// the checks after decoding.
type walker struct {
	file    string
	pos     map[string]*yaml.Node
	aliases int // aliases followed, bounded so that nested aliases cannot blow a file up
}

// maxAliases is the most aliases (*name) a file may follow, counted at every use.
const maxAliases = 1000

var durationType = reflect.TypeFor[duration]()

func (w *walker) fail(n *yaml.Node, path, format string, args ...any) error {
	return &Error{File: w.file, Line: n.Line, Column: n.Column, Path: path, Problem: fmt.Sprintf(format, args...)}
}

func (w *walker) walk(n *yaml.Node, t reflect.Type, path string) error {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		if w.aliases++; w.aliases > maxAliases {
			return w.fail(n, path, "follows more than %d aliases", maxAliases)
		}
		n = n.Alias
	}
	w.pos[path] = n
	null := n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
	switch t.Kind() {
	case reflect.Pointer:
		if null {
			return nil
		}
		return w.walk(n, t.Elem(), path)
	case reflect.Struct:
		if null {
			return nil
		}
		return w.mapping(n, path, func(key *yaml.Node, value *yaml.Node, p string) error {
			f, ok := fieldByTag(t, key.Value)
			if !ok {
				return w.fail(key, p, "unknown field %q (known here: %s)", key.Value, strings.Join(tags(t), ", "))
			}
			return w.walk(value, f.Type, p)
		})
	case reflect.Map:
		if null {
			return nil
		}
		return w.mapping(n, path, func(_ *yaml.Node, value *yaml.Node, p string) error {
			return w.walk(value, t.Elem(), p)
		})
	case reflect.Slice:
		if null {
			return nil
		}
		if n.Kind != yaml.SequenceNode {
			return w.fail(n, path, "must be a list, got %s", describe(n))
		}
		for i, c := range n.Content {
			if err := w.walk(c, t.Elem(), path+"["+strconv.Itoa(i)+"]"); err != nil {
				return err
			}
		}
		return nil
	}
	return w.scalar(n, t, path)
}

// mapping walks a mapping node's pairs, each under the path of its key.
func (w *walker) mapping(n *yaml.Node, path string, each func(key, value *yaml.Node, path string) error) error {
	if n.Kind != yaml.MappingNode {
		return w.fail(n, path, "must be a mapping, got %s", describe(n))
	}
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		key, value := n.Content[i], n.Content[i+1]
		if key.Kind != yaml.ScalarNode || key.Tag == "!!merge" || key.Value == "<<" {
			return w.fail(key, path, "keys must be plain names (no merge keys, lists or mappings)")
		}
		p := join(path, key.Value)
		if seen[key.Value] {
			return w.fail(key, p, "is given twice")
		}
		seen[key.Value] = true
		if err := each(key, value, p); err != nil {
			return err
		}
	}
	return nil
}

func (w *walker) scalar(n *yaml.Node, t reflect.Type, path string) error {
	tag := ""
	if n.Kind == yaml.ScalarNode {
		tag = n.ShortTag()
	}
	switch {
	case t == durationType:
		if tag != "!!str" {
			return w.fail(n, path, "must be a duration such as 1s, 1m or 24h, got %s", describe(n))
		}
	case t.Kind() == reflect.String:
		if tag != "!!str" {
			return w.fail(n, path, "must be a string, got %s", describe(n))
		}
	case t.Kind() == reflect.Int64:
		if tag != "!!int" {
			return w.fail(n, path, "must be an integer, got %s", describe(n))
		}
		if _, err := strconv.ParseInt(strings.ReplaceAll(n.Value, "_", ""), 0, 64); err != nil {
			return w.fail(n, path, "must be an integer that fits 64 bits, got %s", n.Value)
		}
	case t.Kind() == reflect.Bool:
		if tag != "!!bool" {
			return w.fail(n, path, "must be true or false, got %s", describe(n))
		}
	default:
		return w.fail(n, path, "has no checker for %v", t) // a new field's type: add it here
	}
	return nil
}

// describe names a node's kind for an error: "a mapping", "a list", `string "abc"`.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	}
	switch n.ShortTag() {
	case "!!null":
		return "nothing"
	case "!!str":
		return "string " + strconv.Quote(n.Value)
	case "!!int":
		return "integer " + n.Value
	case "!!float":
		return "number " + n.Value
	case "!!bool":
		return "boolean " + n.Value
	}
	return n.ShortTag() + " " + n.Value
}

// join appends a mapping key to a path: ".name" for a plain name, `["a key"]` otherwise.
func join(path, key string) string {
	if plainKey(key) {
		if path == "" {
			return key
		}
		return path + "." + key
	}
	return path + "[" + strconv.Quote(key) + "]"
}

func plainKey(key string) bool {
	if key == "" {
		return false
	}
	for i := 0; i < len(key); i++ {
		c := key[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

func fieldByTag(t reflect.Type, name string) (reflect.StructField, bool) {
	for i := range t.NumField() {
		f := t.Field(i)
		if tagName(f) == name {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

func tagName(f reflect.StructField) string {
	name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
	return name
}

func tags(t reflect.Type) []string {
	var out []string
	for i := range t.NumField() {
		out = append(out, tagName(t.Field(i)))
	}
	sort.Strings(out)
	return out
}
