// Package doccheck holds tests of the user documentation (README.md and docs/*.md)
// against the repository: the tests they cite and the files and headings they link to
// must exist.
package doccheck

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"
)

// root is the repository's root, seen from this package's directory.
const root = "../.."

// citationRE matches the name of a test, benchmark, fuzz target or example as go test
// names them: the prefix, then anything but a lower-case letter. A subtest's path after
// '/' and a benchmark's -N suffix are not part of the match.
var citationRE = regexp.MustCompile(`\b(?:Test|Benchmark|Fuzz|Example)(?:[A-Z0-9_][A-Za-z0-9_]*)?\b`)

// citation is one name cited by a document, where it is cited.
type citation struct {
	name string
	file string // relative to the repository's root
	line int
}

// citations returns the test names a Markdown text cites, in order. The bare prefixes
// ("Test", "Example") are words, not names.
func citations(file, text string) []citation {
	var out []citation
	for i, l := range strings.Split(text, "\n") {
		for _, m := range citationRE.FindAllString(l, -1) {
			switch m {
			case "Test", "Benchmark", "Fuzz", "Example":
				continue
			}
			out = append(out, citation{name: m, file: file, line: i + 1})
		}
	}
	return out
}

func TestCitationsExtraction(t *testing.T) {
	text := "see `TestFoo/sub_case`, BenchmarkBar-8 and FuzzX;\n" +
		"Testing, Tests, Examples, an Example, ExampleRule_shadow, Example_x, TESTFLAGS, (TestA|TestB)"
	var got []string
	for _, c := range citations("x.md", text) {
		got = append(got, c.name)
	}
	want := []string{"TestFoo", "BenchmarkBar", "FuzzX", "ExampleRule_shadow", "Example_x", "TestA", "TestB"}
	if !slices.Equal(got, want) {
		t.Errorf("citations = %q, want %q", got, want)
	}
	if c := citations("x.md", "a\nb TestY")[0]; c.line != 2 {
		t.Errorf("TestY cited on line %d, want 2", c.line)
	}
}

// testFuncs returns the names of the top-level functions of every _test.go file under
// dir, skipping hidden directories and testdata.
func testFuncs(t *testing.T, dir string) map[string]bool {
	t.Helper()
	fset := token.NewFileSet()
	names := map[string]bool{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != dir && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		for _, decl := range f.Decls {
			if fd, ok := decl.(*ast.FuncDecl); ok && fd.Recv == nil {
				names[fd.Name.Name] = true
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return names
}

// TestDocsCiteExistingTests: every test, benchmark, fuzz target and example that
// README.md or a page of docs/ names (as the evidence of a claim, or in a command)
// is a function of the repository's test files.
func TestDocsCiteExistingTests(t *testing.T) {
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	docs = append([]string{filepath.Join(root, "README.md")}, docs...)
	var cited []citation
	for _, p := range docs {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, p)
		cited = append(cited, citations(filepath.ToSlash(rel), string(b))...)
	}
	defined := testFuncs(t, root)
	if !defined["TestDocsCiteExistingTests"] || len(cited) == 0 {
		t.Fatalf("found %d test functions (this one: %v) and %d citations: the search is broken",
			len(defined), defined["TestDocsCiteExistingTests"], len(cited))
	}
	for _, c := range cited {
		if !defined[c.name] {
			t.Errorf("%s:%d cites %s, which no _test.go file defines", c.file, c.line, c.name)
		}
	}
	t.Logf("%d citations of tests in %d documents, %d functions in test files", len(cited), len(docs), len(defined))
}

// linkRE matches the target of a Markdown link or image: ](target).
var linkRE = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// anchor returns GitHub's anchor of a heading's text: lower case, spaces to '-', and
// anything but letters, digits, '-' and '_' dropped.
func anchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// anchors returns the anchors of a Markdown text's headings, outside fenced blocks.
func anchors(text string) map[string]bool {
	out := map[string]bool{}
	fenced := false
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			fenced = !fenced
			continue
		}
		if h, ok := strings.CutPrefix(l, "#"); ok && !fenced {
			out[anchor(strings.TrimLeft(h, "#"))] = true
		}
	}
	return out
}

func TestAnchor(t *testing.T) {
	for h, want := range map[string]string{
		" Redis server settings, and what each server error costs": "redis-server-settings-and-what-each-server-error-costs",
		" Handlers that stream, proxy or hijack":                   "handlers-that-stream-proxy-or-hijack",
		" `Limit(n, w, WithKeyFuncs(KeyByIP, KeyByEndpoint))`":     "limitn-w-withkeyfuncskeybyip-keybyendpoint",
	} {
		if got := anchor(h); got != want {
			t.Errorf("anchor(%q) = %q, want %q", h, got, want)
		}
	}
}

// TestDocsLinksResolve: every relative link of README.md and docs/*.md names a file of
// the repository, and its #fragment, if any, a heading of the Markdown file it names.
func TestDocsLinksResolve(t *testing.T) {
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	docs = append([]string{filepath.Join(root, "README.md")}, docs...)
	links := 0
	for _, p := range docs {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, p)
		for i, l := range strings.Split(string(b), "\n") {
			for _, m := range linkRE.FindAllStringSubmatch(l, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				links++
				file, frag, _ := strings.Cut(target, "#")
				dest := p
				if file != "" {
					dest = filepath.Join(filepath.Dir(p), filepath.FromSlash(file))
				}
				db, err := os.ReadFile(dest)
				if err != nil {
					t.Errorf("%s:%d links to %s: %v", filepath.ToSlash(rel), i+1, target, err)
					continue
				}
				if frag != "" && !anchors(string(db))[frag] {
					drel, _ := filepath.Rel(root, dest)
					t.Errorf("%s:%d links to %s: no heading of %s has the anchor %q", filepath.ToSlash(rel), i+1, target, filepath.ToSlash(drel), frag)
				}
			}
		}
	}
	if links == 0 {
		t.Fatal("no relative link found: the search is broken")
	}
}
