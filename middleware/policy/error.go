package policy

import (
	"strconv"
	"strings"
)

// Error is a policy file refused: where (File, Line, Column), which field (Path) and why
// (Problem). Line and Column count from 1; zero means unknown (a file that is not YAML
// at all may give a line without a column). Path names the field as it is written in
// the file, with list indexes from 0: "rules[1].time.limit", "plans.free.hello.window".
type Error struct {
	File    string
	Line    int
	Column  int
	Path    string
	Problem string
}

// Error returns "file:line:column: path: problem", leaving out the parts that are
// unknown: "policy.yaml:12:5: rules[1].time.limit: must be in 1..1099511627776, got -5".
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		b.WriteString(":" + strconv.Itoa(e.Line))
		if e.Column > 0 {
			b.WriteString(":" + strconv.Itoa(e.Column))
		}
	}
	b.WriteString(": ")
	if e.Path != "" {
		b.WriteString(e.Path + ": ")
	}
	b.WriteString(e.Problem)
	return b.String()
}
