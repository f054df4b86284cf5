// Command testimages builds the images Kubernetes' own network tests pull,
// from Debian's packages and the pinned sources, into an OCI image layout
// folder the VM lab's registry serves (docs/design/lab.md, "Kubernetes'
// network conformance").
//
// Kubernetes publishes these images on registry.k8s.io; liken builds its
// own so that the run needs no registry outside this computer. Each image
// gives the tests what they run in it: agnhost's subcommands, and the
// programs the tests exec (sh, curl, nc, dig, nslookup, wget, hostname,
// ip), from one Debian root all the images share as their first layer.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"liken.sh/liken/image/debian"
	"liken.sh/liken/image/oci"
)

// suite is the Debian release the images' root comes from, the OS image's.
const suite = "bookworm"

// packages are the programs the network tests run in their pods.
var packages = []string{
	"bash", "bind9-dnsutils", "curl", "iproute2", "iputils-ping", "netcat-openbsd",
	"nginx-light", "procps", "socat", "wget",
}

// Image names, as the tests ask for them (test/utils/image/manifest.go
// of the pinned sources), below the registries a --kube-test-repo-list
// file maps: promoterE2eRegistry to REGISTRY/e2e-test-images, gcRegistry
// to REGISTRY.
var (
	agnhost   = "e2e-test-images/agnhost:2.66.1"
	glibcDNS  = "e2e-test-images/glibc-dns-testing:2.1.1"
	nginx     = "e2e-test-images/nginx:1.27.0-2"
	busybox   = "e2e-test-images/busybox:1.37.0-2"
	pauseName = "pause:3.10.2"
)

func main() {
	bin := flag.String("bin", "", "the folder holding agnhost, coredns and pause, built for linux/amd64, and porter's localhost.crt and localhost.key")
	out := flag.String("out", "", "the OCI image layout folder to write")
	cache := flag.String("cache", "", "where the Debian root is cached")
	flag.Parse()
	if *bin == "" || *out == "" || *cache == "" {
		fmt.Fprintln(os.Stderr, "usage: testimages --bin DIR --out DIR --cache DIR")
		os.Exit(2)
	}
	if err := build(*bin, *out, *cache); err != nil {
		fmt.Fprintf(os.Stderr, "testimages: %v\n", err)
		os.Exit(1)
	}
}

func build(bin, out, cache string) error {
	step := func(format string, args ...any) { fmt.Printf("==> "+format+"\n", args...) }
	tarball, err := debian.Root(cache, suite, packages, nil, step)
	if err != nil {
		return err
	}
	base, err := os.ReadFile(tarball)
	if err != nil {
		return err
	}
	read := func(name string) ([]byte, error) { return os.ReadFile(filepath.Join(bin, name)) }
	agnhostBin, err := read("agnhost")
	if err != nil {
		return err
	}
	corednsBin, err := read("coredns")
	if err != nil {
		return err
	}
	pauseBin, err := read("pause")
	if err != nil {
		return err
	}
	// porter's certificate for 127.0.0.1, from agnhost's sources.
	crt, err := read("localhost.crt")
	if err != nil {
		return err
	}
	key, err := read("localhost.key")
	if err != nil {
		return err
	}
	path := []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	images := []oci.Image{
		// agnhost's image: its server, a CoreDNS at /coredns (the DNS
		// tests' own name servers), /uploads for netexec and porter's
		// certificate.
		{Name: agnhost, Base: base, Files: map[string][]byte{"agnhost": agnhostBin, "coredns": corednsBin}, Dirs: []string{"uploads"},
			Data:       map[string][]byte{"localhost.crt": crt, "localhost.key": key},
			Entrypoint: []string{"/agnhost"}, Cmd: []string{"pause"}, Env: path},
		// The DNS tests' glibc resolver: dig and getent over Debian's C
		// library.
		{Name: glibcDNS, Base: base, Files: map[string][]byte{"coredns": corednsBin}, Cmd: []string{"bash"}, Env: path},
		// A web server on port 80.
		{Name: nginx, Base: base, Cmd: []string{"nginx", "-g", "daemon off;"}, Env: path},
		// A shell with wget and nc.
		{Name: busybox, Base: base, Cmd: []string{"sh"}, Env: path},
		{Name: pauseName, Files: map[string][]byte{"pause": pauseBin}, Entrypoint: []string{"/pause"}},
	}
	if err := oci.WriteLayout(out, images); err != nil {
		return err
	}
	step("%d images in %s, over a Debian root of %d MiB", len(images), out, len(base)>>20)
	return nil
}
