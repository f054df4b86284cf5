package boot

import _ "embed"

//go:embed grub.cfg
var grubConfig []byte

// GrubConfig returns the grub.cfg liken ships in /boot/grub. It reads the
// state from grubenv and grubenv.bak next to it and boots /A or /B
// (vmlinuz and initrd.img) on the same partition.
func GrubConfig() []byte {
	return append([]byte(nil), grubConfig...)
}
