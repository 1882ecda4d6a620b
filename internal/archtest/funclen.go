package archtest

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// MaxFuncLines is the longest a product function may be, counted from the
// line of its `func` keyword to the line of its closing brace.
const MaxFuncLines = 80

// Func is one function declaration of a product package.
type Func struct {
	Name  string // package-relative: "controller.Run", "reconciler.(*Controller).Pass"
	Pos   string // file:line, module-relative
	Lines int
}

func (f Func) String() string { return fmt.Sprintf("%s (%s): %d lines", f.Name, f.Pos, f.Lines) }

// LongFuncs returns the functions of g's product packages (their non-test
// .go files under root) longer than limit lines, longest first.
func LongFuncs(root string, g Graph, limit int) ([]Func, error) {
	var out []Func
	for p := range g {
		if !g.product(p) || p == "." {
			continue
		}
		fs, err := packageFuncs(root, p)
		if err != nil {
			return nil, err
		}
		for _, f := range fs {
			if f.Lines > limit {
				out = append(out, f)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Lines != out[j].Lines {
			return out[i].Lines > out[j].Lines
		}
		return out[i].Name < out[j].Name
	})
	return out, nil
}

// packageFuncs parses the non-test Go files of package p (module-relative)
// and returns every function declaration with its length.
func packageFuncs(root, p string) ([]Func, error) {
	dir := filepath.Join(root, filepath.FromSlash(p))
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	fset := token.NewFileSet()
	var out []Func
	for _, e := range ents {
		n := e.Name()
		if e.IsDir() || !strings.HasSuffix(n, ".go") || strings.HasSuffix(n, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, n), nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			start, end := fset.Position(fd.Pos()), fset.Position(fd.End())
			out = append(out, Func{Name: p + "." + funcName(fd), Pos: fmt.Sprintf("%s/%s:%d", p, n, start.Line), Lines: end.Line - start.Line + 1})
		}
	}
	return out, nil
}

// funcName is "F", "T.M" or "(*T).M".
func funcName(fd *ast.FuncDecl) string {
	if fd.Recv == nil || len(fd.Recv.List) == 0 {
		return fd.Name.Name
	}
	t := fd.Recv.List[0].Type
	if ix, ok := t.(*ast.IndexExpr); ok { // generic receiver T[K]
		t = ix.X
	}
	switch r := t.(type) {
	case *ast.StarExpr:
		x := r.X
		if ix, ok := x.(*ast.IndexExpr); ok {
			x = ix.X
		}
		if id, ok := x.(*ast.Ident); ok {
			return "(*" + id.Name + ")." + fd.Name.Name
		}
	case *ast.Ident:
		return r.Name + "." + fd.Name.Name
	}
	return fd.Name.Name
}
