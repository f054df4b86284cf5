package manifests

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	yaml "go.yaml.in/yaml/v3"
	"gotest.tools/v3/assert"
	"gotest.tools/v3/golden"
)

// The CRD schemas are written by hand, but every description in them is
// the doc comment of the matching Go field in apis/liken/v1alpha1 (or, for
// the standard parts, in k8s.io/apimachinery): kubectl explain prints the
// same text a Go reader sees. TestCRDDescriptions fails when the two drift;
// `go test ./manifests -run TestCRDDescriptions -update` rewrites the
// descriptions and leaves every other line of the files as it is.
func TestCRDDescriptions(t *testing.T) {
	types := loadGoTypes(t)
	for _, tc := range []struct{ file, root string }{
		{"10-crd-cluster.yaml", "Cluster"},
		{"11-crd-machine.yaml", "Machine"},
	} {
		t.Run(tc.root, func(t *testing.T) {
			before, err := os.ReadFile(tc.file)
			assert.NilError(t, err)
			after, missing, err := describe(before, types, tc.root)
			assert.NilError(t, err)
			assert.Assert(t, len(missing) == 0,
				"%s: these schema properties have no Go field with a doc comment to describe them: %s",
				tc.file, strings.Join(missing, ", "))
			if golden.FlagUpdate() {
				assert.NilError(t, os.WriteFile(tc.file, after, 0o644))
				return
			}
			assert.Assert(t, string(before) == string(after),
				"%s: a description differs from its Go doc comment in apis/liken/v1alpha1; "+
					"run: go test ./manifests -run TestCRDDescriptions -update\n%s",
				tc.file, firstDiff(string(before), string(after)))
		})
	}
}

// TestCRDsDescribeEveryProperty reads the CRDs as the API server does and
// checks that kubectl explain has a description for every property.
func TestCRDsDescribeEveryProperty(t *testing.T) {
	for _, file := range []string{"10-crd-cluster.yaml", "11-crd-machine.yaml"} {
		b, err := FS.ReadFile(file)
		assert.NilError(t, err)
		var crd struct {
			Spec struct {
				Versions []struct {
					Schema struct {
						OpenAPIV3Schema schema `yaml:"openAPIV3Schema"`
					} `yaml:"schema"`
				} `yaml:"versions"`
			} `yaml:"spec"`
		}
		assert.NilError(t, yaml.Unmarshal(b, &crd))
		var undescribed []string
		for _, v := range crd.Spec.Versions {
			v.Schema.OpenAPIV3Schema.walk("", func(path string, s schema) {
				if path == "metadata" {
					// The API server describes metadata itself; see walk.
					return
				}
				if strings.TrimSpace(s.Description) == "" {
					undescribed = append(undescribed, path)
				}
			})
		}
		assert.Assert(t, len(undescribed) == 0, "%s: kubectl explain prints <no description> for %s", file, strings.Join(undescribed, ", "))
	}
}

type schema struct {
	Description          string            `yaml:"description"`
	Properties           map[string]schema `yaml:"properties"`
	Items                *schema           `yaml:"items"`
	AdditionalProperties *schema           `yaml:"additionalProperties"`
}

func (s schema) walk(path string, f func(string, schema)) {
	if path != "" {
		f(path, s)
	}
	for name, p := range s.Properties {
		p.walk(strings.TrimPrefix(path+"."+name, "."), f)
	}
	if s.Items != nil {
		for name, p := range s.Items.Properties {
			p.walk(path+"[]."+name, f)
		}
	}
	if s.AdditionalProperties != nil {
		for name, p := range s.AdditionalProperties.Properties {
			p.walk(path+"{}."+name, f)
		}
	}
}

// goField is one JSON-visible field of a Go struct.
type goField struct {
	json string
	doc  string
	typ  ast.Expr
	pkg  string // the package the field is declared in, for resolving typ
}

// goType is a Go type the schema may describe.
type goType struct {
	doc    string
	fields []goField // nil for a type that is not a struct
	values []string  // the documented constants of a string type
}

// goTypes holds the types of liken's API and of the apimachinery packages
// it embeds, keyed by "pkg.Name" (pkg is "" for liken's own).
type goTypes map[string]goType

func loadGoTypes(t *testing.T) goTypes {
	t.Helper()
	types := goTypes{}
	parsePackage(t, types, "", filepath.Join("..", "apis", "liken", "v1alpha1"))
	out, err := exec.Command("go", "list", "-f", "{{.Dir}}", "k8s.io/apimachinery/pkg/apis/meta/v1").Output()
	assert.NilError(t, err, "go list k8s.io/apimachinery/pkg/apis/meta/v1")
	parsePackage(t, types, "metav1", strings.TrimSpace(string(out)))
	return types
}

func parsePackage(t *testing.T, types goTypes, name, dir string) {
	t.Helper()
	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, dir, func(fi os.FileInfo) bool {
		return !strings.HasSuffix(fi.Name(), "_test.go") && !strings.HasPrefix(fi.Name(), "zz_")
	}, parser.ParseComments)
	assert.NilError(t, err)
	for _, p := range pkgs {
		for _, f := range p.Files {
			imports := map[string]string{}
			for _, imp := range f.Imports {
				if imp.Name != nil && strings.Trim(imp.Path.Value, `"`) == "k8s.io/apimachinery/pkg/apis/meta/v1" {
					imports[imp.Name.Name] = "metav1"
				}
			}
			for _, decl := range f.Decls {
				gd, ok := decl.(*ast.GenDecl)
				if !ok || gd.Tok != token.TYPE {
					continue
				}
				for _, spec := range gd.Specs {
					ts := spec.(*ast.TypeSpec)
					text := ts.Doc.Text()
					if text == "" && len(gd.Specs) == 1 {
						text = gd.Doc.Text()
					}
					gt := goType{doc: cleanDoc(text)}
					switch tt := ts.Type.(type) {
					case *ast.StructType:
						gt.fields = []goField{}
						for _, fld := range tt.Fields.List {
							jsonName := jsonNameOf(fld)
							if jsonName == "-" {
								continue
							}
							typ := fld.Type
							if sel, ok := typ.(*ast.SelectorExpr); ok {
								if alias, ok := imports[sel.X.(*ast.Ident).Name]; ok {
									typ = &ast.SelectorExpr{X: ast.NewIdent(alias), Sel: sel.Sel}
								}
							}
							gt.fields = append(gt.fields, goField{json: jsonName, doc: cleanDoc(fld.Doc.Text()), typ: typ, pkg: name})
						}
					}
					k := key(name, ts.Name.Name)
					gt.values = types[k].values
					types[k] = gt
				}
			}
			collectValues(types, name, f)
		}
	}
}

// collectValues records the documented constants of each named type, as
// "Value: what it means", in the order they are declared.
func collectValues(types goTypes, pkg string, f *ast.File) {
	for _, decl := range f.Decls {
		gd, ok := decl.(*ast.GenDecl)
		if !ok || gd.Tok != token.CONST {
			continue
		}
		for _, spec := range gd.Specs {
			vs := spec.(*ast.ValueSpec)
			typ, ok := vs.Type.(*ast.Ident)
			if !ok || len(vs.Names) != 1 || len(vs.Values) != 1 {
				continue
			}
			lit, ok := vs.Values[0].(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				continue
			}
			text := cleanDoc(vs.Doc.Text())
			text = strings.TrimPrefix(text, vs.Names[0].Name+" ")
			text = strings.TrimPrefix(text, "means ")
			if text == "" {
				continue
			}
			k := key(pkg, typ.Name)
			gt := types[k]
			gt.values = append(gt.values, strings.Trim(lit.Value, `"`)+": "+text)
			types[k] = gt
		}
	}
}

func key(pkg, name string) string {
	if pkg == "" {
		return name
	}
	return pkg + "." + name
}

// jsonNameOf is the field's JSON name: "" for an inlined (embedded) field.
func jsonNameOf(f *ast.Field) string {
	tag := ""
	if f.Tag != nil {
		tag = reflect.StructTag(strings.Trim(f.Tag.Value, "`")).Get("json")
	}
	name, opts, _ := strings.Cut(tag, ",")
	if strings.Contains(","+opts+",", ",inline,") || (len(f.Names) == 0 && name == "") {
		return ""
	}
	if name == "" && len(f.Names) > 0 {
		return f.Names[0].Name
	}
	return name
}

// cleanDoc turns a Go doc comment into a description: marker lines
// (+optional, +listType=...) go, wrapped lines join, paragraphs stay.
func cleanDoc(text string) string {
	var paras []string
	var cur []string
	flush := func() {
		if len(cur) > 0 {
			paras = append(paras, strings.Join(cur, " "))
			cur = nil
		}
	}
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(line, "+"), strings.HasPrefix(line, "---"):
		case line == "":
			flush()
		default:
			cur = append(cur, line)
		}
	}
	flush()
	return strings.Join(paras, "\n\n")
}

// resolve follows pointers, slices and maps to the named type the schema
// describes. It returns the type's key, or "" for a type with no fields of
// its own (a string, a number, a time).
func (types goTypes) resolve(pkg string, e ast.Expr) string {
	switch t := e.(type) {
	case *ast.StarExpr:
		return types.resolve(pkg, t.X)
	case *ast.ArrayType:
		return types.resolve(pkg, t.Elt)
	case *ast.MapType:
		return types.resolve(pkg, t.Value)
	case *ast.Ident:
		if _, ok := types[key(pkg, t.Name)]; ok {
			return key(pkg, t.Name)
		}
	case *ast.SelectorExpr:
		k := key(t.X.(*ast.Ident).Name, t.Sel.Name)
		if _, ok := types[k]; ok {
			return k
		}
	}
	return ""
}

// fieldsOf lists the JSON fields of a struct type, inlined ones expanded.
func (types goTypes) fieldsOf(k string) map[string]goField {
	out := map[string]goField{}
	gt := types[k]
	pkg, _, found := strings.Cut(k, ".")
	if !found {
		pkg = ""
	}
	for _, f := range gt.fields {
		if f.json == "" {
			if inner := types.resolve(pkg, f.typ); inner != "" {
				for n, g := range types.fieldsOf(inner) {
					out[n] = g
				}
			}
			continue
		}
		out[f.json] = f
	}
	return out
}

// edit is the replacement of lines [from, to) of a file (0-based) by text.
type edit struct {
	from, to int
	text     []string
}

// describe returns the CRD file with every property's description set
// from the Go types, and the schema paths no Go doc comment describes.
func describe(file []byte, types goTypes, root string) ([]byte, []string, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(file, &doc); err != nil {
		return nil, nil, err
	}
	lines := strings.Split(string(file), "\n")
	versions := lookup(doc.Content[0], "spec", "versions")
	if versions == nil {
		return nil, nil, fmt.Errorf("no spec.versions")
	}
	d := &describer{types: types, lines: lines}
	for _, v := range versions.Content {
		s := lookup(v, "schema", "openAPIV3Schema")
		if s == nil {
			return nil, nil, fmt.Errorf("a version has no schema.openAPIV3Schema")
		}
		d.set(s, types[root].doc, root)
		d.walk(s, root, root)
	}
	if d.err != nil {
		return nil, nil, d.err
	}
	sort.Slice(d.edits, func(i, j int) bool { return d.edits[i].from > d.edits[j].from })
	for _, e := range d.edits {
		lines = append(lines[:e.from], append(e.text, lines[e.to:]...)...)
	}
	return []byte(strings.Join(lines, "\n")), d.missing, nil
}

type describer struct {
	types   goTypes
	lines   []string
	edits   []edit
	missing []string
	err     error
}

// walk sets the descriptions of the properties of schema node s, which
// describes the Go type k.
func (d *describer) walk(s *yaml.Node, k, path string) {
	props := lookup(s, "properties")
	if props == nil {
		return
	}
	fields := d.types.fieldsOf(k)
	pkg, _, found := strings.Cut(k, ".")
	if !found {
		pkg = ""
	}
	for i := 0; i+1 < len(props.Content); i += 2 {
		name, val := props.Content[i].Value, props.Content[i+1]
		p := path + "." + name
		if p == path+".metadata" && !strings.Contains(path, ".") {
			// The API server describes an object's metadata itself and
			// refuses a CRD whose schema says more than its type.
			continue
		}
		f, ok := fields[name]
		if !ok {
			d.missing = append(d.missing, p)
			continue
		}
		inner := d.types.resolve(pkg, f.typ)
		text := f.doc
		if text == "" && inner != "" {
			text = d.types[inner].doc
		}
		if text == "" {
			d.missing = append(d.missing, p)
			continue
		}
		if inner != "" && len(d.types[inner].values) > 0 {
			text += "\n\n" + strings.Join(d.types[inner].values, "\n\n")
		}
		d.set(val, text, p)
		if inner == "" || d.types[inner].fields == nil {
			continue
		}
		target := val
		if items := lookup(val, "items"); items != nil {
			target = items
		} else if ap := lookup(val, "additionalProperties"); ap != nil {
			target = ap
		}
		d.walk(target, inner, p)
	}
}

// set makes description the first key of mapping node m, replacing the
// description already there.
func (d *describer) set(m *yaml.Node, text, path string) {
	if m.Kind != yaml.MappingNode || len(m.Content) == 0 {
		d.err = fmt.Errorf("%s: the schema is not a mapping", path)
		return
	}
	first := m.Content[0]
	indent := strings.Repeat(" ", first.Column-1)
	block := wrap(indent, text)
	if first.Value != "description" {
		for i := 0; i < len(m.Content); i += 2 {
			if m.Content[i].Value == "description" {
				d.err = fmt.Errorf("%s: put description first in its mapping (line %d)", path, m.Content[i].Line)
				return
			}
		}
		d.edits = append(d.edits, edit{from: first.Line - 1, to: first.Line - 1, text: block})
		return
	}
	end := len(d.lines)
	if len(m.Content) > 2 {
		end = m.Content[2].Line - 1
	}
	d.edits = append(d.edits, edit{from: first.Line - 1, to: end, text: block})
}

// wrap writes description as a folded block scalar, lines at most 100
// columns wide where the words allow.
func wrap(indent, text string) []string {
	out := []string{indent + "description: >-"}
	width := 100 - len(indent) - 2
	if width < 40 {
		width = 40
	}
	for i, para := range strings.Split(text, "\n\n") {
		if i > 0 {
			out = append(out, "")
		}
		line := ""
		for _, w := range strings.Fields(para) {
			if line != "" && len(line)+1+len(w) > width {
				out = append(out, indent+"  "+line)
				line = ""
			}
			if line != "" {
				line += " "
			}
			line += w
		}
		if line != "" {
			out = append(out, indent+"  "+line)
		}
	}
	return out
}

// lookup follows keys through nested mappings.
func lookup(n *yaml.Node, keys ...string) *yaml.Node {
	for _, k := range keys {
		if n == nil || n.Kind != yaml.MappingNode {
			return nil
		}
		var next *yaml.Node
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i].Value == k {
				next = n.Content[i+1]
				break
			}
		}
		n = next
	}
	return n
}

func firstDiff(a, b string) string {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := 0; i < len(al) && i < len(bl); i++ {
		if al[i] != bl[i] {
			return fmt.Sprintf("line %d:\n  file: %s\n  want: %s", i+1, al[i], bl[i])
		}
	}
	return fmt.Sprintf("the files differ in length (%d and %d lines)", len(al), len(bl))
}
