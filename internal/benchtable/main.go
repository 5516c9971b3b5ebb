// Command benchtable reads `go test -bench` output on standard input and prints the
// benchmark results as an aligned table: name, ns/op, B/op, allocs/op and every custom
// metric reported with testing.B.ReportMetric (one column per unit, in order of first
// appearance). Lines that are not results (goos, pkg, PASS, ok, ...) are dropped, except
// "pkg:" lines, which start a new section, and failures and skips, which are passed
// through. With -v, go test prints a skipped benchmark's reason (the indented lines
// after its name), which is passed through below its SKIP line.
//
//	go test -v -run '^$' -bench . -benchmem ./... | go run ./internal/benchtable
package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strings"
)

type result struct {
	name    string
	metrics map[string]string
}

type section struct {
	pkg     string
	results []result
	units   []string
}

func main() {
	if err := run(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "benchtable:", err)
		os.Exit(1)
	}
}

func run(r io.Reader, w io.Writer) error {
	var sections []*section
	cur := &section{}
	sections = append(sections, cur)
	failed := false
	var logged []string // the indented lines printed since the last benchmark's name
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "pkg: "):
			cur = &section{pkg: strings.TrimPrefix(line, "pkg: ")}
			sections = append(sections, cur)
		case strings.HasPrefix(line, "Benchmark"):
			if res, ok := parse(line); ok {
				cur.add(res)
			} else {
				logged = logged[:0] // -v: a benchmark's name, before it runs
			}
		case strings.HasPrefix(line, "    "):
			logged = append(logged, line)
		case strings.HasPrefix(line, "--- SKIP"):
			fmt.Fprintln(w, line)
			for _, l := range logged {
				fmt.Fprintln(w, l)
			}
			logged = logged[:0]
		case strings.HasPrefix(line, "--- FAIL"), strings.HasPrefix(line, "FAIL"), strings.HasPrefix(line, "panic:"):
			failed = true
			fmt.Fprintln(w, line)
			if strings.HasPrefix(line, "--- FAIL") {
				for _, l := range logged {
					fmt.Fprintln(w, l)
				}
				logged = logged[:0]
			}
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	for _, s := range sections {
		if len(s.results) > 0 {
			s.print(w)
		}
	}
	if failed {
		return fmt.Errorf("some benchmarks failed")
	}
	return nil
}

// parse reads "BenchmarkName-8  1000  123 ns/op  45 B/op  2 allocs/op  0.9 x-ping".
func parse(line string) (result, bool) {
	f := strings.Fields(line)
	if len(f) < 4 || len(f)%2 != 0 {
		return result{}, false
	}
	res := result{name: f[0], metrics: map[string]string{}}
	for i := 2; i+1 < len(f); i += 2 {
		res.metrics[f[i+1]] = f[i]
	}
	return res, true
}

// fixed are the standard columns, in this order, before the custom metrics.
var fixed = []string{"ns/op", "B/op", "allocs/op"}

func (s *section) add(r result) {
	s.results = append(s.results, r)
	for u := range r.metrics {
		known := false
		for _, k := range s.units {
			known = known || k == u
		}
		if !known {
			s.units = append(s.units, u)
		}
	}
}

func (s *section) columns() []string {
	cols := []string{}
	for _, u := range fixed {
		for _, k := range s.units {
			if k == u {
				cols = append(cols, u)
				break
			}
		}
	}
	var custom []string
	for _, u := range s.units {
		isFixed := false
		for _, k := range fixed {
			isFixed = isFixed || k == u
		}
		if !isFixed {
			custom = append(custom, u)
		}
	}
	sortStrings(custom)
	return append(cols, custom...)
}

func (s *section) print(w io.Writer) {
	cols := s.columns()
	rows := [][]string{append([]string{"benchmark"}, cols...)}
	for _, r := range s.results {
		row := []string{r.name}
		for _, c := range cols {
			v, ok := r.metrics[c]
			if !ok {
				v = "-"
			}
			row = append(row, v)
		}
		rows = append(rows, row)
	}
	width := make([]int, len(rows[0]))
	for _, row := range rows {
		for i, v := range row {
			width[i] = max(width[i], len(v))
		}
	}
	if s.pkg != "" {
		fmt.Fprintf(w, "\n%s\n", s.pkg)
	}
	for n, row := range rows {
		var b strings.Builder
		for i, v := range row {
			if i == 0 {
				fmt.Fprintf(&b, "%-*s", width[i], v)
			} else {
				fmt.Fprintf(&b, "  %*s", width[i], v)
			}
		}
		fmt.Fprintln(w, strings.TrimRight(b.String(), " "))
		if n == 0 {
			total := len(width)*2 - 2
			for _, x := range width {
				total += x
			}
			fmt.Fprintln(w, strings.Repeat("-", total))
		}
	}
}

// sortStrings sorts s in place (insertion sort; a handful of units).
func sortStrings(s []string) {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
}
