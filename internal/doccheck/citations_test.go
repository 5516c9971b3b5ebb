// Package doccheck holds tests of the user documentation (README.md and docs/*.md)
// against the code: what the documents cite as evidence must exist.
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
