package release

import (
	"bufio"
	"bytes"
	"fmt"
	"strings"
)

// PackagesPath is the optional artifact that lists what a release carries:
// every Debian package and every component built from source, one
// "NAME VERSION" a line (make image writes it as packages.txt).
const PackagesPath = "packages.txt"

// MaxPackagesBytes bounds the size of a packages.txt that is read.
const MaxPackagesBytes = 4 << 20

// EtcdComponent is the name packages.txt gives the leaders' etcd, which
// make image builds from source: "built:etcd v3.7.0".
const EtcdComponent = "built:etcd"

// ComponentVersion returns the version packages.txt (list) gives name, or
// "" when no line names it. A line that names it without a version, or
// two lines that give it different versions, are an error.
func ComponentVersion(list []byte, name string) (string, error) {
	if len(list) > MaxPackagesBytes {
		return "", fmt.Errorf("%s is %d bytes, more than the limit of %d bytes (MaxPackagesBytes)", PackagesPath, len(list), MaxPackagesBytes)
	}
	found := ""
	sc := bufio.NewScanner(bytes.NewReader(list))
	sc.Buffer(make([]byte, 0, 64<<10), MaxPackagesBytes)
	for n := 1; sc.Scan(); n++ {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 || fields[0] != name {
			continue
		}
		if len(fields) != 2 {
			return "", fmt.Errorf("%s line %d names %s but is not NAME VERSION: %q", PackagesPath, n, name, short(sc.Text()))
		}
		if found != "" && found != fields[1] {
			return "", fmt.Errorf("%s names %s twice, with the versions %s and %s", PackagesPath, name, found, short(fields[1]))
		}
		found = fields[1]
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("reading %s: %w", PackagesPath, err)
	}
	return found, nil
}
