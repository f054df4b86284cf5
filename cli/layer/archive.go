package layer

import (
	"archive/tar"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"
	"unicode"

	"sigs.k8s.io/yaml"

	"liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/internal/atomicfile"
	"liken.sh/liken/node/controlplane"
)

// Member names inside a layer archive.
const (
	// ManifestMember describes the archive: its format, cluster and machines.
	ManifestMember = "layer.yaml"
	// ClusterMember is the Cluster document.
	ClusterMember = "cluster.yaml"
	// MachinesDir holds one Machine document per machine, <name>.yaml.
	MachinesDir = "machines/"
	// IdentityDir holds the cluster identity (see IdentityFiles).
	IdentityDir = "identity/"
	// Format is the archive format this version writes and reads.
	Format = "liken.sh/layer/v1"
)

// Manifest is layer.yaml: what the archive holds.
type Manifest struct {
	// Format is always Format.
	Format string `json:"format"`
	// Cluster is the Cluster's name.
	Cluster string `json:"cluster"`
	// Machines are the machines' names, sorted.
	Machines []string `json:"machines"`
	// SharedJoinToken is true when the fleet opted in to one join token for
	// every machine (the identity's): then the layer holds no machine's own.
	SharedJoinToken bool `json:"sharedJoinToken,omitempty"`
}

// Layer is a deployment layer: one Cluster, its Machines and the cluster
// identity.
type Layer struct {
	// Cluster is the Cluster document.
	Cluster *Document
	// Machines are the Machine documents, sorted by name.
	Machines []*Document
	// Identity is the cluster identity.
	Identity *Identity
	// Tokens are the machines' own join tokens: all of them in the fleet's
	// layer and a leader's, the worker's own in a worker's.
	Tokens []controlplane.MachineToken
	// SharedJoinToken is true when every machine joins with the identity's
	// join token (liken layer pack --shared-join-token), which then may ask
	// for any Machine's certificate.
	SharedJoinToken bool
}

// Limits bound what Read accepts.
type Limits struct {
	// MaxArchiveBytes bounds the compressed archive.
	MaxArchiveBytes int64
	// MaxTotalBytes bounds the sum of the members' sizes.
	MaxTotalBytes int64
	// MaxMemberBytes bounds one member.
	MaxMemberBytes int64
	// MaxMembers bounds the number of members.
	MaxMembers int
}

// DefaultLimits fit a fleet of a few thousand machines with room to spare.
var DefaultLimits = Limits{
	MaxArchiveBytes: 32 << 20,
	MaxTotalBytes:   64 << 20,
	MaxMemberBytes:  1 << 20,
	MaxMembers:      8192,
}

// maxMemberName bounds a member's name (machines/ + a 253-byte name + .yaml
// fits).
const maxMemberName = 300

// epoch is the modification time of every member, so the same inputs give
// the same archive bytes.
var epoch = time.Unix(0, 0).UTC()

// Write writes the layer as a gzip-compressed tar archive. The output is
// reproducible: members in a fixed order, fixed times and owners, mode 0600.
func (l *Layer) Write(w io.Writer) error {
	if l.Cluster == nil || l.Identity == nil {
		return errors.New("a layer needs a Cluster and an identity")
	}
	m := Manifest{Format: Format, Cluster: l.Cluster.Name, SharedJoinToken: l.SharedJoinToken}
	for _, d := range l.Machines {
		m.Machines = append(m.Machines, d.Name)
	}
	mb, err := yaml.Marshal(m)
	if err != nil {
		return err
	}
	zw, err := gzip.NewWriterLevel(w, gzip.BestCompression)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(zw)
	add := func(name string, b []byte) error {
		hdr := &tar.Header{
			Typeflag: tar.TypeReg,
			Name:     name,
			Mode:     0o600,
			Size:     int64(len(b)),
			ModTime:  epoch,
			Format:   tar.FormatPAX,
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		_, err := tw.Write(b)
		return err
	}
	if err := add(ManifestMember, mb); err != nil {
		return err
	}
	if err := add(ClusterMember, l.Cluster.YAML); err != nil {
		return err
	}
	for _, d := range l.Machines {
		if err := add(MachinesDir+d.Name+".yaml", d.YAML); err != nil {
			return err
		}
	}
	for _, name := range IdentityFiles() {
		b, ok := l.Identity.Files[name]
		if !ok {
			continue // a worker's layer has no private keys
		}
		if err := add(IdentityDir+name, b); err != nil {
			return err
		}
	}
	if len(l.Tokens) > 0 {
		b, err := marshalTokens(l.Tokens)
		if err != nil {
			return err
		}
		if err := add(JoinTokensMember, b); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return zw.Close()
}

// WriteFile writes the layer to path with mode 0600, whole or not at all
// (atomicfile), so a failed write or a power cut leaves the old file or
// none. It refuses to replace an existing file unless overwrite is set.
func (l *Layer) WriteFile(path string, overwrite bool) error {
	if !overwrite {
		if _, err := os.Lstat(path); err == nil {
			return fmt.Errorf("%s already exists: choose another name or pass --force to replace it", path)
		}
	}
	return atomicfile.WriteFunc(path, 0o600, l.Write)
}

// ReadFile reads and checks a layer archive file (see Read).
func ReadFile(path string, lim Limits) (*Layer, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	if st.Size() > lim.MaxArchiveBytes {
		return nil, fmt.Errorf("%s is %d bytes, more than the %d a layer archive may have", path, st.Size(), lim.MaxArchiveBytes)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	l, err := Read(f, lim)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return l, nil
}

// MemberError is a problem with one member of an archive.
type MemberError struct {
	// Member is the member's name as the archive spells it.
	Member string
	// Err is what is wrong.
	Err error
}

func (e *MemberError) Error() string { return fmt.Sprintf("member %q: %v", e.Member, e.Err) }

func (e *MemberError) Unwrap() error { return e.Err }

// limitReader reads at most n bytes, then fails with err.
type limitReader struct {
	r   io.Reader
	n   int64
	err error
}

func (l *limitReader) Read(p []byte) (int, error) {
	if l.n <= 0 {
		return 0, l.err
	}
	if int64(len(p)) > l.n {
		p = p[:l.n]
	}
	n, err := l.r.Read(p)
	l.n -= int64(n)
	return n, err
}

// Read reads a layer archive and checks everything in it before returning:
// only regular files with clean relative names (no absolute paths, no ..,
// no links or devices), within lim; the expected members and nothing else;
// every document valid as the API server would find it; a complete,
// consistent identity. Errors name the member and, for documents, the field.
func Read(r io.Reader, lim Limits) (*Layer, error) {
	members, err := readMembers(r, lim)
	if err != nil {
		return nil, err
	}
	return parseMembers(members)
}

func readMembers(r io.Reader, lim Limits) (map[string][]byte, error) {
	errArchive := fmt.Errorf("the archive is larger than %d bytes", lim.MaxArchiveBytes)
	cr := &limitReader{r: r, n: lim.MaxArchiveBytes, err: errArchive}
	zr, err := gzip.NewReader(cr)
	if err != nil {
		if errors.Is(err, errArchive) {
			return nil, err
		}
		return nil, fmt.Errorf("not a gzip-compressed layer archive: %w", err)
	}
	// Headers, padding and PAX records come on top of the members' bytes.
	overhead := int64(lim.MaxMembers)*4096 + 1<<20
	errUncompressed := fmt.Errorf("the archive holds more than %d bytes", lim.MaxTotalBytes)
	ur := &limitReader{r: zr, n: lim.MaxTotalBytes + overhead, err: errUncompressed}
	tr := tar.NewReader(ur)
	members := map[string][]byte{}
	var total int64
	count := 0
	last := ""
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, readError(err, last, errArchive, errUncompressed)
		}
		count++
		if count > lim.MaxMembers {
			return nil, fmt.Errorf("the archive has more than %d members", lim.MaxMembers)
		}
		name, err := memberName(hdr.Name, hdr.Typeflag == tar.TypeDir)
		if err != nil {
			return nil, &MemberError{Member: hdr.Name, Err: err}
		}
		last = hdr.Name
		switch hdr.Typeflag {
		case tar.TypeReg:
		case tar.TypeDir:
			continue
		case tar.TypeSymlink, tar.TypeLink:
			return nil, &MemberError{Member: hdr.Name, Err: fmt.Errorf("is a link (to %q): a layer archive holds only regular files", hdr.Linkname)}
		case tar.TypeChar, tar.TypeBlock:
			return nil, &MemberError{Member: hdr.Name, Err: errors.New("is a device file: a layer archive holds only regular files")}
		case tar.TypeFifo:
			return nil, &MemberError{Member: hdr.Name, Err: errors.New("is a FIFO: a layer archive holds only regular files")}
		default:
			return nil, &MemberError{Member: hdr.Name, Err: fmt.Errorf("has type %q: a layer archive holds only regular files", hdr.Typeflag)}
		}
		if name == "" {
			return nil, &MemberError{Member: hdr.Name, Err: errors.New("a file cannot be the archive's root")}
		}
		if hdr.Size < 0 || hdr.Size > lim.MaxMemberBytes {
			return nil, &MemberError{Member: hdr.Name, Err: fmt.Errorf("is %d bytes, more than the %d a member may have", hdr.Size, lim.MaxMemberBytes)}
		}
		total += hdr.Size
		if total > lim.MaxTotalBytes {
			return nil, &MemberError{Member: hdr.Name, Err: fmt.Errorf("brings the archive past %d bytes", lim.MaxTotalBytes)}
		}
		if _, dup := members[name]; dup {
			return nil, &MemberError{Member: hdr.Name, Err: errors.New("appears twice in the archive")}
		}
		b := make([]byte, hdr.Size)
		if _, err := io.ReadFull(tr, b); err != nil {
			return nil, &MemberError{Member: hdr.Name, Err: readError(err, "", errArchive, errUncompressed)}
		}
		members[name] = b
	}
	// Read to the end of the gzip stream, so its checksum is verified.
	if _, err := io.Copy(io.Discard, ur); err != nil {
		return nil, readError(err, last, errArchive, errUncompressed)
	}
	return members, nil
}

func readError(err error, after string, limits ...error) error {
	for _, l := range limits {
		if errors.Is(err, l) {
			return l
		}
	}
	if errors.Is(err, io.ErrUnexpectedEOF) {
		err = errors.New("the archive is truncated")
	} else {
		err = fmt.Errorf("the archive is corrupt: %w", err)
	}
	if after != "" {
		return fmt.Errorf("%w (after member %q)", err, after)
	}
	return err
}

// memberName checks a member's name and returns it in canonical form: no
// leading ./, no trailing /. It refuses absolute names, .. and anything
// that is not a clean relative path.
func memberName(name string, dir bool) (string, error) {
	if len(name) > maxMemberName {
		return "", fmt.Errorf("the name is longer than %d bytes", maxMemberName)
	}
	if strings.HasPrefix(name, "/") {
		return "", errors.New("is an absolute path: a layer archive holds only relative paths")
	}
	if strings.ContainsRune(name, '\\') {
		return "", errors.New("contains a backslash: a layer archive uses / only")
	}
	for _, r := range name {
		if unicode.IsControl(r) || r == unicode.ReplacementChar {
			return "", errors.New("contains control characters or invalid UTF-8")
		}
	}
	n := strings.TrimPrefix(name, "./")
	if dir {
		n = strings.TrimSuffix(n, "/")
	}
	if n == "" || n == "." {
		if dir {
			return "", nil
		}
		return "", errors.New("has an empty name")
	}
	for _, el := range strings.Split(n, "/") {
		switch el {
		case "..":
			return "", errors.New("leaves the archive (..): a layer archive holds only paths inside it")
		case "", ".":
			return "", errors.New("is not a clean path (empty or . elements)")
		}
	}
	return n, nil
}

// parseMembers checks and decodes the members of an archive.
func parseMembers(members map[string][]byte) (*Layer, error) {
	var errs []error
	memberErr := func(name string, err error) {
		errs = append(errs, &MemberError{Member: name, Err: err})
	}
	mb, ok := members[ManifestMember]
	if !ok {
		return nil, fmt.Errorf("no %s: this is not a liken layer archive (liken layer pack writes one)", ManifestMember)
	}
	var man Manifest
	if err := yaml.UnmarshalStrict(mb, &man); err != nil {
		return nil, &MemberError{Member: ManifestMember, Err: fmt.Errorf("not a valid layer manifest: %w", err)}
	}
	if man.Format != Format {
		return nil, &MemberError{Member: ManifestMember, Err: fmt.Errorf("format %q is not %q: this liken cannot read it (upgrade liken, or pack the layer again)", man.Format, Format)}
	}

	l := &Layer{Identity: &Identity{Files: map[string][]byte{}}}
	identityNames := map[string]bool{}
	for _, n := range IdentityFiles() {
		identityNames[n] = true
	}
	names := make([]string, 0, len(members))
	for n := range members {
		names = append(names, n)
	}
	sort.Strings(names)
	var docs []*Document
	for _, n := range names {
		b := members[n]
		switch {
		case n == ManifestMember, n == JoinTokensMember:
		case n == ClusterMember:
			d, err := ValidateDocument(n, b)
			if err != nil {
				errs = append(errs, err)
				break
			}
			if d.Kind != KindCluster {
				memberErr(n, fmt.Errorf("holds a %s, not a Cluster", d.Kind))
				break
			}
			docs = append(docs, d)
		case strings.HasPrefix(n, MachinesDir):
			base := strings.TrimPrefix(n, MachinesDir)
			if strings.Contains(base, "/") || !strings.HasSuffix(base, ".yaml") {
				memberErr(n, errors.New("is not expected in a layer archive: machines/ holds only <name>.yaml files"))
				break
			}
			d, err := ValidateDocument(n, b)
			if err != nil {
				errs = append(errs, err)
				break
			}
			if d.Kind != KindMachine {
				memberErr(n, fmt.Errorf("holds a %s, not a Machine", d.Kind))
				break
			}
			if d.Name+".yaml" != base {
				memberErr(n, fmt.Errorf("holds Machine %q: the file must be named %s%s.yaml", d.Name, MachinesDir, d.Name))
				break
			}
			docs = append(docs, d)
		case strings.HasPrefix(n, IdentityDir) && identityNames[strings.TrimPrefix(n, IdentityDir)]:
			l.Identity.Files[strings.TrimPrefix(n, IdentityDir)] = b
		default:
			memberErr(n, errors.New("is not expected in a layer archive"))
		}
	}
	if _, ok := members[ClusterMember]; !ok {
		errs = append(errs, fmt.Errorf("no %s: the archive has no Cluster document", ClusterMember))
	}
	if len(errs) == 0 {
		cluster, machines, ferrs := CheckFleet(docs)
		errs = append(errs, ferrs...)
		if cluster != nil {
			l.Cluster = cluster
			l.Machines = machines
			var got []string
			for _, m := range machines {
				got = append(got, m.Name)
			}
			if man.Cluster != cluster.Name || strings.Join(man.Machines, ",") != strings.Join(got, ",") {
				errs = append(errs, &MemberError{Member: ManifestMember, Err: errors.New("does not list the archive's Cluster and Machines: the archive was changed after it was packed")})
			}
			if b, ok := members[JoinTokensMember]; ok {
				tokens, err := parseTokens(b, machines)
				if err != nil {
					memberErr(JoinTokensMember, err)
				}
				l.Tokens = tokens
			}
		}
	}
	l.SharedJoinToken = man.SharedJoinToken
	if l.SharedJoinToken && len(l.Tokens) > 0 {
		errs = append(errs, &MemberError{Member: JoinTokensMember, Err: errors.New("a layer whose machines share one join token holds no machine's own")})
	}
	if _, ok := l.Identity.Files[TokenFile]; l.SharedJoinToken && !ok {
		errs = append(errs, fmt.Errorf("the layer's machines share the identity's join token, and %s%s is missing", IdentityDir, TokenFile))
	}
	if err := l.Identity.Verify(); err != nil {
		errs = append(errs, fmt.Errorf("the identity in %s: %w", IdentityDir, err))
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return l, nil
}

// Machine returns the layer's Machine document of that name, or nil.
func (l *Layer) Machine(name string) *v1alpha1.Machine {
	for _, d := range l.Machines {
		if d.Name == name {
			return d.Machine
		}
	}
	return nil
}

// ForMachine returns the layer as the named machine's disk carries it. A
// leader gets the whole layer, every worker's join token included (its
// control-plane init makes them tokens of the cluster). A worker gets it
// without the identity's private keys, so that a stolen worker disk cannot
// sign certificates or service-account tokens, and with its own join token
// only (or, in a fleet that opted in to one, the shared one), so that it
// cannot join as another machine. It fails when the layer has no such
// machine.
func (l *Layer) ForMachine(name string) (*Layer, error) {
	m := l.Machine(name)
	if m == nil {
		return nil, fmt.Errorf("the layer has no Machine %q", name)
	}
	if m.Spec.Role == v1alpha1.RoleLeader {
		return l, nil
	}
	out := *l
	out.Identity = l.Identity.WithoutPrivateKeys()
	out.Tokens = nil
	if !l.SharedJoinToken {
		delete(out.Identity.Files, TokenFile)
		t, ok := l.Token(name)
		if !ok {
			return nil, fmt.Errorf("the layer holds no join token for Machine %s: pack the layer again (liken layer pack)", name)
		}
		out.Tokens = []controlplane.MachineToken{t}
	}
	return &out, nil
}
