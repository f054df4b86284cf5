package release

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"k8s.io/apimachinery/pkg/util/version"

	noderelease "liken.sh/liken/release"
)

// AllowEtcdMinorChangeFlag is the flag that lets liken release publish a
// release whose etcd minor version differs from the channel's previous
// release.
const AllowEtcdMinorChangeFlag = "allow-etcd-minor-change"

// etcdUpgradeDoc is where the reason for the etcd minor-version check is
// written down.
const etcdUpgradeDoc = "docs/design/controlplane.md, section 2"

// EtcdOutcome says what liken release found when it compared a release's
// etcd version with the channel's previous release.
type EtcdOutcome string

// Outcomes of the etcd check of a published release. A refused release is
// an error, not an outcome.
const (
	// EtcdSameMinor: both releases name etcd with the same minor version.
	EtcdSameMinor EtcdOutcome = "SameMinor"
	// EtcdNoPreviousRelease: the channel holds no release below this one,
	// so there is nothing to compare with.
	EtcdNoPreviousRelease EtcdOutcome = "NoPreviousRelease"
	// EtcdPreviousUnknown: the previous release does not say its etcd
	// version (no packages.txt, or one without etcd), so nothing was
	// compared.
	EtcdPreviousUnknown EtcdOutcome = "PreviousEtcdUnknown"
	// EtcdChangeAllowed: the minor version changes, or this release does
	// not say its etcd version, and --allow-etcd-minor-change allowed it.
	EtcdChangeAllowed EtcdOutcome = "ChangeAllowed"
)

// EtcdCheck is the result of comparing a release's etcd version with the
// channel's previous release.
type EtcdCheck struct {
	// Outcome says what was found.
	Outcome EtcdOutcome
	// Etcd is the etcd version the release names, or "" when it names none.
	Etcd string
	// Previous is the channel's previous release, or "" when there is none.
	Previous string
	// PreviousEtcd is the etcd version Previous names, or "".
	PreviousEtcd string
	// Message says what was compared, in a sentence for the person
	// publishing.
	Message string
}

// checkEtcd compares the etcd version of the release version, as the
// packages.txt file packages names it ("" when the release carries none),
// with the channel's previous release: the highest version below version
// in the channel's index. It refuses a change of etcd's minor version, and
// a release that does not say its etcd version after one that does,
// unless allow is set. It reads the previous release's packages.txt from
// the channel directory and checks it against that release's document.
func checkEtcd(channel, version, packages string, allow bool) (*EtcdCheck, error) {
	c := &EtcdCheck{}
	if packages != "" {
		b, err := readPackages(packages, -1, "")
		if err != nil {
			return nil, fmt.Errorf("reading the release's %s (%s): %w", noderelease.PackagesPath, packages, err)
		}
		if c.Etcd, err = noderelease.ComponentVersion(b, noderelease.EtcdComponent); err != nil {
			return nil, fmt.Errorf("the release's %s (%s): %w", noderelease.PackagesPath, packages, err)
		}
		if c.Etcd != "" {
			if _, err := etcdMinor(c.Etcd); err != nil {
				return nil, fmt.Errorf("the release's %s (%s) names etcd %q, which is not a version such as v3.7.0: fix the line %q", noderelease.PackagesPath, packages, c.Etcd, noderelease.EtcdComponent+" "+c.Etcd)
			}
		}
	}
	this := "release " + version
	if c.Etcd != "" {
		this += " (etcd " + c.Etcd + ")"
	}

	idx, err := noderelease.ReadIndex(channel)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", filepath.Join(channel, noderelease.IndexName), err)
	}
	for _, e := range idx.Releases {
		if e.Version < version && e.Version > c.Previous {
			c.Previous = e.Version
		}
	}
	if c.Previous == "" {
		c.Outcome = EtcdNoPreviousRelease
		c.Message = fmt.Sprintf("The channel holds no release before %s: there is no etcd version to compare with.", this)
		return c, nil
	}
	var why string
	c.PreviousEtcd, why, err = previousEtcd(channel, idx.Lookup(c.Previous))
	if err != nil {
		return nil, err
	}
	if c.PreviousEtcd == "" {
		c.Outcome = EtcdPreviousUnknown
		c.Message = fmt.Sprintf("The channel's previous release %s does not say its etcd version (%s): %s was published without comparing etcd's minor version.", c.Previous, why, this)
		return c, nil
	}
	prev := fmt.Sprintf("the channel's previous release %s carries etcd %s", c.Previous, c.PreviousEtcd)
	consequence := "Once the last leader runs a newer etcd minor, the datastore's cluster version and storage schema move up to it, " +
		"and a leader whose trial then fails cannot go back to the older etcd of its proven slot: it cannot rejoin without a person"
	if c.Etcd == "" {
		what := "carries no " + noderelease.PackagesPath
		if packages != "" {
			what = "has a " + noderelease.PackagesPath + " without a " + noderelease.EtcdComponent + " line"
		}
		if !allow {
			return nil, fmt.Errorf("release %s %s, so its etcd version cannot be compared, and %s. %s (%s). "+
				"Publish it with --artifact %s=FILE (make image writes one), "+
				"or pass --%s if its etcd minor version may differ and the upgrade is planned",
				version, what, prev, consequence, etcdUpgradeDoc, noderelease.PackagesPath, AllowEtcdMinorChangeFlag)
		}
		c.Outcome = EtcdChangeAllowed
		c.Message = fmt.Sprintf("Release %s %s, so its etcd version was not compared with %s's (%s); --%s allowed it.",
			version, what, c.Previous, c.PreviousEtcd, AllowEtcdMinorChangeFlag)
		return c, nil
	}
	prevMinor, err := etcdMinor(c.PreviousEtcd)
	if err != nil {
		c.Outcome = EtcdPreviousUnknown
		c.Message = fmt.Sprintf("The channel's previous release %s names etcd %q, which is not a version: %s was published without comparing etcd's minor version.", c.Previous, c.PreviousEtcd, this)
		return c, nil
	}
	minor, _ := etcdMinor(c.Etcd) // checked above
	if minor == prevMinor {
		c.Outcome = EtcdSameMinor
		c.Message = fmt.Sprintf("etcd %s keeps the minor version %s of the channel's previous release %s (etcd %s).", c.Etcd, minor, c.Previous, c.PreviousEtcd)
		return c, nil
	}
	if !allow {
		return nil, fmt.Errorf("release %s carries etcd %s and %s: etcd's minor version would change from %s to %s. %s (%s). "+
			"Publish a release with etcd %s.x, or pass --%s once the upgrade across etcd minor versions is planned",
			version, c.Etcd, prev, prevMinor, minor, consequence, etcdUpgradeDoc, prevMinor, AllowEtcdMinorChangeFlag)
	}
	c.Outcome = EtcdChangeAllowed
	c.Message = fmt.Sprintf("etcd's minor version changes from %s (etcd %s in %s) to %s (etcd %s); --%s allowed it: "+
		"once the last leader runs etcd %s, a leader whose trial fails cannot go back to etcd %s.",
		prevMinor, c.PreviousEtcd, c.Previous, minor, c.Etcd, AllowEtcdMinorChangeFlag, minor, prevMinor)
	return c, nil
}

// previousEtcd returns the etcd version the published release e names in
// its packages.txt, or "" and why it names none. A packages.txt that does
// not match the release's document, or a release document that does not
// match its index entry, is an error: the channel is damaged.
func previousEtcd(channel string, e *noderelease.IndexEntry) (etcd, why string, err error) {
	dir := filepath.Join(channel, e.Version)
	digest, doc, err := noderelease.DigestOf(context.Background(), nil, dir)
	if errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Sprintf("the index lists it, but %s is missing", filepath.Join(dir, noderelease.DocumentName)), nil
	}
	if err != nil {
		return "", "", fmt.Errorf("reading the channel's previous release %s to compare etcd versions: %w", e.Version, err)
	}
	if digest != e.Digest {
		return "", "", fmt.Errorf("the channel's previous release %s is damaged: its %s has the digest %s, but index.yaml gives %s; "+
			"a published release never changes: restore %s from a backup", e.Version, noderelease.DocumentName, digest, e.Digest, dir)
	}
	a := doc.Artifact(noderelease.PackagesPath)
	if a == nil {
		return "", "it carries no " + noderelease.PackagesPath, nil
	}
	b, err := readPackages(filepath.Join(dir, filepath.FromSlash(a.Path)), a.Size, a.SHA256)
	if err != nil {
		return "", "", fmt.Errorf("the channel's previous release %s is damaged: %w; a published release never changes: restore %s from a backup", e.Version, err, dir)
	}
	etcd, err = noderelease.ComponentVersion(b, noderelease.EtcdComponent)
	if err != nil {
		return "", fmt.Sprintf("its %s cannot be read: %v", noderelease.PackagesPath, err), nil
	}
	if etcd == "" {
		return "", fmt.Sprintf("its %s has no %s line", noderelease.PackagesPath, noderelease.EtcdComponent), nil
	}
	return etcd, "", nil
}

// readPackages reads a packages.txt of at most MaxPackagesBytes. With
// size >= 0 it must be size bytes with the sha256 sum.
func readPackages(path string, size int64, sum string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, noderelease.MaxPackagesBytes+1))
	if err != nil {
		return nil, err
	}
	if len(b) > noderelease.MaxPackagesBytes {
		return nil, fmt.Errorf("%s is larger than the limit of %d bytes (MaxPackagesBytes)", path, noderelease.MaxPackagesBytes)
	}
	if size >= 0 {
		h := sha256.Sum256(b)
		if int64(len(b)) != size || hex.EncodeToString(h[:]) != sum {
			return nil, fmt.Errorf("%s does not match the release document (%d bytes, sha256 %s; the document gives %d bytes, sha256 %s)",
				path, len(b), hex.EncodeToString(h[:]), size, sum)
		}
	}
	return b, nil
}

// etcdMinor returns the major and minor version of an etcd version such as
// v3.7.0: "3.7".
func etcdMinor(v string) (string, error) {
	p, err := version.ParseGeneric(v)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%d.%d", p.Major(), p.Minor()), nil
}
