package layer

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"

	apiextensions "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel"
	structuraldefaulting "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/defaulting"
	structurallisttype "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/listtype"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/pruning"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/validation"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"k8s.io/apimachinery/pkg/util/validation/field"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"sigs.k8s.io/yaml"

	"liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/internal/window"
	"liken.sh/liken/manifests"
)

// crdFiles are liken's CRDs in manifests/: documents are checked with
// exactly the schema and CEL rules the API server applies.
var crdFiles = []string{"10-crd-cluster.yaml", "11-crd-machine.yaml"}

// Kinds a layer holds.
const (
	KindCluster = "Cluster"
	KindMachine = "Machine"
)

var apiVersion = v1alpha1.SchemeGroupVersion.String()

// maxDocumentFile bounds one input file of documents.
const maxDocumentFile = 8 << 20

// kindValidator checks objects of one kind as the API server does on create.
type kindValidator struct {
	structural *structuralschema.Structural
	schema     validation.SchemaValidator
	cel        *cel.Validator
}

var loadValidators = sync.OnceValues(func() (map[string]*kindValidator, error) {
	out := map[string]*kindValidator{}
	for _, name := range crdFiles {
		b, err := manifests.FS.ReadFile(name)
		if err != nil {
			return nil, err
		}
		var crd apiextv1.CustomResourceDefinition
		if err := yaml.UnmarshalStrict(b, &crd); err != nil {
			return nil, fmt.Errorf("built-in CRD %s: %w", name, err)
		}
		for _, v := range crd.Spec.Versions {
			if v.Name != v1alpha1.SchemeGroupVersion.Version || v.Schema == nil {
				continue
			}
			var internal apiextensions.JSONSchemaProps
			if err := apiextv1.Convert_v1_JSONSchemaProps_To_apiextensions_JSONSchemaProps(v.Schema.OpenAPIV3Schema, &internal, nil); err != nil {
				return nil, fmt.Errorf("built-in CRD %s: %w", name, err)
			}
			s, err := structuralschema.NewStructural(&internal)
			if err != nil {
				return nil, fmt.Errorf("built-in CRD %s: %w", name, err)
			}
			sv, _, err := validation.NewSchemaValidator(&internal)
			if err != nil {
				return nil, fmt.Errorf("built-in CRD %s: %w", name, err)
			}
			out[crd.Spec.Names.Kind] = &kindValidator{
				structural: s,
				schema:     sv,
				cel:        cel.NewValidator(s, true, celconfig.PerCallLimit),
			}
		}
	}
	for _, k := range []string{KindCluster, KindMachine} {
		if out[k] == nil {
			return nil, fmt.Errorf("built-in CRDs lack the %s kind", k)
		}
	}
	return out, nil
})

// Document is one validated Cluster or Machine document.
type Document struct {
	// Source says where the document came from, for messages: a file name
	// and, in a multi-document file, the document's position.
	Source string
	// Kind is Cluster or Machine.
	Kind string
	// Name is metadata.name.
	Name string
	// YAML is the document as the layer stores it: apiVersion, kind,
	// metadata (name, labels, annotations) and spec, without defaults.
	YAML []byte
	// Cluster is the decoded object when Kind is Cluster, with the API
	// server's defaults applied.
	Cluster *v1alpha1.Cluster
	// Machine is the decoded object when Kind is Machine, with defaults.
	Machine *v1alpha1.Machine
}

// DocumentError is a problem in one document, naming the document and the
// field.
type DocumentError struct {
	// Source names the document.
	Source string
	// Errs are the field errors, as the API server would report them.
	Errs field.ErrorList
	// Err is a problem that is not about one field (YAML syntax, kind).
	Err error
	// Unchecked is set when the CEL rules were not run because of schema
	// errors, as the API server does.
	Unchecked bool
}

func (e *DocumentError) Error() string {
	if e.Err != nil {
		return e.Source + ": " + e.Err.Error()
	}
	msgs := make([]string, 0, len(e.Errs)+1)
	for _, fe := range e.Errs {
		msgs = append(msgs, fe.Error())
	}
	if e.Unchecked {
		msgs = append(msgs, "(the remaining rules were not checked; fix the errors above first)")
	}
	if len(msgs) == 1 {
		return e.Source + ": " + msgs[0]
	}
	return e.Source + ":\n  " + strings.Join(msgs, "\n  ")
}

// ParseDocuments splits a stream of YAML documents (separated by ---, or a
// kind: List) and validates each with ValidateDocument. It returns the
// valid documents and one error per invalid document.
func ParseDocuments(source string, r io.Reader) ([]*Document, []error) {
	lr := &io.LimitedReader{R: r, N: maxDocumentFile + 1}
	yr := utilyaml.NewYAMLReader(bufio.NewReader(lr))
	var (
		docs []*Document
		errs []error
		n    int
	)
	multi := false
	for {
		raw, err := yr.Read()
		if err == io.EOF {
			break
		}
		if lr.N <= 0 {
			return docs, append(errs, fmt.Errorf("%s: more than %d bytes of documents", source, maxDocumentFile))
		}
		if err != nil {
			return docs, append(errs, fmt.Errorf("%s: %w", source, err))
		}
		if isEmptyDocument(raw) {
			continue
		}
		n++
		if n > 1 {
			multi = true
		}
		src := fmt.Sprintf("%s (document %d)", source, n)
		obj, err := decodeObject(raw)
		if err != nil {
			errs = append(errs, &DocumentError{Source: src, Err: err})
			continue
		}
		if obj["kind"] == "List" {
			items, _ := obj["items"].([]interface{})
			for i, it := range items {
				item, ok := it.(map[string]interface{})
				isrc := fmt.Sprintf("%s items[%d]", src, i)
				if !ok {
					errs = append(errs, &DocumentError{Source: isrc, Err: errors.New("a List item must be an object")})
					continue
				}
				d, err := ValidateObject(isrc, item)
				if err != nil {
					errs = append(errs, err)
					continue
				}
				docs = append(docs, d)
			}
			continue
		}
		d, err := ValidateObject(src, obj)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		docs = append(docs, d)
	}
	if !multi {
		// A single document is named by its file alone.
		for _, d := range docs {
			d.Source = strings.Replace(d.Source, " (document 1)", "", 1)
		}
		for i, e := range errs {
			if de, ok := e.(*DocumentError); ok {
				de.Source = strings.Replace(de.Source, " (document 1)", "", 1)
				errs[i] = de
			}
		}
	}
	return docs, errs
}

func isEmptyDocument(raw []byte) bool {
	for _, line := range bytes.Split(raw, []byte("\n")) {
		t := bytes.TrimSpace(line)
		if len(t) > 0 && t[0] != '#' && string(t) != "---" {
			return false
		}
	}
	return true
}

// decodeObject turns one YAML document into a JSON-like map, refusing
// duplicate keys, with numbers decoded the way the API server decodes them.
func decodeObject(raw []byte) (map[string]interface{}, error) {
	j, err := yaml.YAMLToJSONStrict(raw)
	if err != nil {
		return nil, fmt.Errorf("not valid YAML: %w", err)
	}
	var v interface{}
	if err := utiljson.Unmarshal(j, &v); err != nil {
		return nil, fmt.Errorf("not valid YAML: %w", err)
	}
	obj, ok := v.(map[string]interface{})
	if !ok {
		return nil, errors.New("a document must be a YAML mapping (apiVersion, kind, metadata, spec)")
	}
	return obj, nil
}

// ValidateDocument validates one YAML document (see ValidateObject).
func ValidateDocument(source string, raw []byte) (*Document, error) {
	obj, err := decodeObject(raw)
	if err != nil {
		return nil, &DocumentError{Source: source, Err: err}
	}
	return ValidateObject(source, obj)
}

// ValidateObject checks one Cluster or Machine the way the API server checks
// a create (metadata, unknown fields, defaults, the CRD's schema and CEL
// rules), plus the windows' time zones; errors name the document and field.
func ValidateObject(source string, obj map[string]interface{}) (*Document, error) {
	vals, err := loadValidators()
	if err != nil {
		return nil, err
	}
	av, _ := obj["apiVersion"].(string)
	kind, _ := obj["kind"].(string)
	if kind == "" || av == "" {
		return nil, &DocumentError{Source: source, Err: errors.New("apiVersion and kind are required (apiVersion: liken.sh/v1alpha1, kind: Cluster or Machine)")}
	}
	if av != apiVersion || (kind != KindCluster && kind != KindMachine) {
		return nil, &DocumentError{Source: source, Err: fmt.Errorf("is a %s %s: a layer holds only %s Cluster and Machine documents", av, kind, apiVersion)}
	}
	kv := vals[kind]
	name := ""
	if md, ok := obj["metadata"].(map[string]interface{}); ok {
		name, _ = md["name"].(string)
	}
	src := source + ": " + kind
	if name != "" {
		src += " " + name
	}

	// The object as the API server would see it on create.
	obj = runtime.DeepCopyJSON(obj)
	delete(obj, "status")
	meta, errs := canonicalMeta(obj)
	if len(errs) > 0 {
		return nil, &DocumentError{Source: src, Errs: errs}
	}
	stored := map[string]interface{}{"apiVersion": av, "kind": kind, "metadata": obj["metadata"]}
	if spec, ok := obj["spec"]; ok {
		stored["spec"] = runtime.DeepCopyJSONValue(spec)
	}
	unknown := pruning.PruneWithOptions(obj, kv.structural, true, structuralschema.UnknownFieldPathOptions{TrackUnknownFieldPaths: true})
	for _, p := range unknown {
		errs = append(errs, field.Forbidden(field.NewPath(p), "unknown field; check its spelling and indentation (kubectl explain "+strings.ToLower(kind)+"s --recursive lists the fields)"))
	}
	structuraldefaulting.Default(obj, kv.structural)

	errs = append(errs, apivalidation.ValidateObjectMetaAccessor(meta, false, apivalidation.NameIsDNSSubdomain, field.NewPath("metadata"))...)
	errs = append(errs, validation.ValidateCustomResource(nil, obj, kv.schema)...)
	errs = append(errs, structurallisttype.ValidateListSetsAndMaps(nil, kv.structural, obj)...)
	unchecked := hasBlockingErr(errs)
	if !unchecked {
		ce, _ := kv.cel.Validate(context.Background(), nil, kv.structural, obj, nil, celconfig.RuntimeCELCostBudget)
		errs = append(errs, ce...)
	}
	if len(errs) > 0 {
		return nil, &DocumentError{Source: src, Errs: errs, Unchecked: unchecked}
	}

	j, err := utiljson.Marshal(obj)
	if err != nil {
		return nil, err
	}
	d := &Document{Source: source, Kind: kind, Name: meta.Name}
	switch kind {
	case KindCluster:
		d.Cluster = &v1alpha1.Cluster{}
		err = utiljson.Unmarshal(j, d.Cluster)
	case KindMachine:
		d.Machine = &v1alpha1.Machine{}
		err = utiljson.Unmarshal(j, d.Machine)
	}
	if err != nil {
		return nil, &DocumentError{Source: src, Err: err}
	}
	if d.Cluster != nil {
		// What the API server's rules cannot check: that each window's time
		// zone exists. cluster-operator would grant nothing until it is
		// fixed.
		if _, errs := window.Parse(d.Cluster.Spec.Disruption.Windows); len(errs) > 0 {
			return nil, &DocumentError{Source: src, Errs: errs}
		}
	}
	d.YAML, err = yaml.Marshal(stored)
	if err != nil {
		return nil, err
	}
	return d, nil
}

// canonicalMeta checks metadata and keeps only what a person declares: name,
// labels and annotations. Fields the API server sets (uid, resourceVersion,
// creationTimestamp, managedFields, ...) are dropped, so the output of
// kubectl get -o yaml can be packed.
func canonicalMeta(obj map[string]interface{}) (*metav1.ObjectMeta, field.ErrorList) {
	p := field.NewPath("metadata")
	raw, ok := obj["metadata"]
	if !ok {
		return nil, field.ErrorList{field.Required(p.Child("name"), "every document needs metadata.name")}
	}
	md, ok := raw.(map[string]interface{})
	if !ok {
		return nil, field.ErrorList{field.Invalid(p, raw, "metadata must be a mapping")}
	}
	j, err := utiljson.Marshal(md)
	if err != nil {
		return nil, field.ErrorList{field.Invalid(p, nil, err.Error())}
	}
	var meta metav1.ObjectMeta
	if err := utiljson.Unmarshal(j, &meta); err != nil {
		return nil, field.ErrorList{field.Invalid(p, nil, err.Error())}
	}
	var errs field.ErrorList
	if meta.GenerateName != "" {
		errs = append(errs, field.Forbidden(p.Child("generateName"), "a layer names every object: set metadata.name"))
	}
	if meta.Namespace != "" {
		errs = append(errs, field.Forbidden(p.Child("namespace"), "Clusters and Machines are cluster-scoped: remove metadata.namespace"))
	}
	keep := map[string]interface{}{"name": meta.Name}
	if len(meta.Labels) > 0 {
		keep["labels"] = md["labels"]
	}
	if len(meta.Annotations) > 0 {
		keep["annotations"] = md["annotations"]
	}
	obj["metadata"] = keep
	return &metav1.ObjectMeta{Name: meta.Name, Labels: meta.Labels, Annotations: meta.Annotations}, errs
}

// hasBlockingErr mirrors the API server: CEL rules are not run on an object
// whose schema errors make them meaningless.
func hasBlockingErr(errs field.ErrorList) bool {
	for _, e := range errs {
		switch e.Type {
		case field.ErrorTypeNotSupported, field.ErrorTypeRequired, field.ErrorTypeTooLong, field.ErrorTypeTooMany, field.ErrorTypeTypeInvalid:
			return true
		}
	}
	return false
}

// CheckFleet checks what no single document can: exactly one Cluster, at
// least one Machine, every Machine in that Cluster, unique machine names,
// at least one Leader, and, once those hold, that the Leaders' control
// plane can be configured (LeaderConfig): with two or more Leaders, each
// has a static address or the reach URL annotations, and the reach URLs
// pass controlplane.Config.Validate. Problems with one Machine are
// *DocumentError.
func CheckFleet(docs []*Document) (cluster *Document, machines []*Document, errs []error) {
	var clusters []*Document
	for _, d := range docs {
		switch d.Kind {
		case KindCluster:
			clusters = append(clusters, d)
		case KindMachine:
			machines = append(machines, d)
		}
	}
	switch len(clusters) {
	case 0:
		errs = append(errs, errors.New("no Cluster document: a layer needs exactly one (kind: Cluster)"))
	case 1:
		cluster = clusters[0]
	default:
		var where []string
		for _, c := range clusters {
			where = append(where, c.Name+" in "+c.Source)
		}
		errs = append(errs, fmt.Errorf("%d Cluster documents (%s): a layer holds exactly one", len(clusters), strings.Join(where, ", ")))
	}
	if len(machines) == 0 {
		errs = append(errs, errors.New("no Machine documents: a layer needs at least one (kind: Machine)"))
	}
	seen := map[string]string{}
	leaders := 0
	for _, m := range machines {
		if prev, ok := seen[m.Name]; ok {
			dup := field.Duplicate(field.NewPath("metadata", "name"), m.Name)
			dup.Detail = "also declared in " + prev
			errs = append(errs, &DocumentError{Source: m.Source + ": Machine " + m.Name, Errs: field.ErrorList{dup}})
			continue
		}
		seen[m.Name] = m.Source
		if cluster != nil && m.Machine.Spec.Cluster != cluster.Name {
			errs = append(errs, &DocumentError{Source: m.Source + ": Machine " + m.Name, Errs: field.ErrorList{
				field.Invalid(field.NewPath("spec", "cluster"), m.Machine.Spec.Cluster, fmt.Sprintf("the layer's Cluster is %q", cluster.Name))}})
		}
		if m.Machine.Spec.Role == v1alpha1.RoleLeader {
			leaders++
		}
	}
	if len(machines) > 0 && leaders == 0 {
		errs = append(errs, errors.New("no Machine has spec.role: Leader: a cluster needs at least one leader to run the datastore and the control plane"))
	}
	sort.Slice(machines, func(i, j int) bool { return machines[i].Name < machines[j].Name })
	if len(errs) == 0 {
		errs = checkControlPlane(cluster, machines)
	}
	return cluster, machines, errs
}
