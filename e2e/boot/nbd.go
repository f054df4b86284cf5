package boote2e

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
)

// CacheDisk serves a disk image to QEMU over NBD as a disk with a
// volatile write cache: a write the machine sends stays in memory, where
// reads see it, and reaches the image file only when the machine asks for
// a flush. Cutting the power loses every write not flushed, as a real
// disk's cache may; QEMU's own file cache (cache=writeback) keeps them.
//
// CutAt decides, at each flush request and before it is carried out,
// whether the power fails there. From the cut on the disk answers nothing
// and writes nothing; the image file holds what a real disk could hold
// after the power came back.
type CacheDisk struct {
	// Socket is the Unix socket QEMU connects to.
	Socket string
	// CutAt sees the writes waiting for the flush; true cuts the power.
	CutAt func(CacheView) bool

	file     *os.File
	size     int64
	ln       net.Listener
	mu       sync.Mutex
	pending  []Write
	cut      chan struct{}
	lost     []Write
	flushes  int
	serveErr error
}

// CacheView is what CutAt sees at a flush request.
type CacheView struct {
	// Pending are the writes not flushed yet, in the order they came.
	Pending []Write
	// Read returns n bytes at off as the machine reads them (the pending
	// writes over the image file).
	Read func(off, n int64) []byte
}

// Touch reports whether a pending write overlaps [off, off+n).
func (v CacheView) Touch(off, n int64) bool {
	for _, w := range v.Pending {
		if w.Offset < off+n && off < w.Offset+int64(len(w.Data)) {
			return true
		}
	}
	return false
}

// Write is one write the machine sent to the disk.
type Write struct {
	Offset int64
	Data   []byte
}

// NBD protocol constants (the fixed newstyle handshake, simple replies).
const (
	nbdMagic        = 0x4e42444d41474943 // "NBDMAGIC"
	nbdOptMagic     = 0x49484156454f5054 // "IHAVEOPT"
	nbdRepMagic     = 0x0003e889045565a9
	nbdReqMagic     = 0x25609513
	nbdReplyMagic   = 0x67446698
	nbdFlagFixed    = 1 << 0
	nbdFlagNoZeroes = 1 << 1
	nbdOptAbort     = 2
	nbdOptGo        = 7
	nbdRepAck       = 1
	nbdRepInfo      = 3
	nbdRepErrUnsup  = 1<<31 | 1
	nbdInfoExport   = 0
	// The export: it takes flushes; no FUA (QEMU then follows such writes
	// with a flush), no trim.
	nbdTransmitFlags = 1<<0 | 1<<2
	nbdCmdRead       = 0
	nbdCmdWrite      = 1
	nbdCmdDisc       = 2
	nbdCmdFlush      = 3
	nbdEIO           = 5
	nbdEINVAL        = 22
)

// errProtocol marks a request the server does not understand.
var errProtocol = errors.New("nbd: protocol error")

// ServeCacheDisk serves path on a new Unix socket in dir.
func ServeCacheDisk(path, dir string, cutAt func(CacheView) bool) (*CacheDisk, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	sock := dir + "/nbd.sock"
	ln, err := net.Listen("unix", sock)
	if err != nil {
		f.Close()
		return nil, err
	}
	d := &CacheDisk{Socket: sock, CutAt: cutAt, file: f, size: st.Size(), ln: ln, cut: make(chan struct{})}
	go d.accept()
	return d, nil
}

// DriveArg is QEMU's -drive value for this disk.
func (d *CacheDisk) DriveArg() string {
	return "file=nbd+unix:///?socket=" + d.Socket + ",format=raw,if=virtio,cache=writeback"
}

// Cut is closed when the power was cut.
func (d *CacheDisk) Cut() <-chan struct{} { return d.cut }

// Lost are the writes the cut lost, in the order the machine sent them.
func (d *CacheDisk) Lost() []Write {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.lost
}

// Flushes counts the flushes carried out.
func (d *CacheDisk) Flushes() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.flushes
}

// Close stops serving and closes the image file. Writes not flushed by
// then are lost, as at a power cut.
func (d *CacheDisk) Close() error {
	d.ln.Close()
	d.mu.Lock()
	defer d.mu.Unlock()
	err := d.file.Close()
	return errors.Join(err, d.serveErr)
}

func (d *CacheDisk) accept() {
	for {
		c, err := d.ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			// The connection ends with QEMU, killed at any moment: only a
			// request this server does not understand is an error.
			if err := d.serve(c); errors.Is(err, errProtocol) {
				d.mu.Lock()
				d.serveErr = errors.Join(d.serveErr, err)
				d.mu.Unlock()
			}
		}()
	}
}

func (d *CacheDisk) serve(c net.Conn) error {
	be := binary.BigEndian
	hello := make([]byte, 18)
	be.PutUint64(hello[0:], nbdMagic)
	be.PutUint64(hello[8:], nbdOptMagic)
	be.PutUint16(hello[16:], nbdFlagFixed|nbdFlagNoZeroes)
	if _, err := c.Write(hello); err != nil {
		return err
	}
	var clientFlags uint32
	if err := binary.Read(c, be, &clientFlags); err != nil {
		return err
	}
	optReply := func(opt, typ uint32, data []byte) error {
		b := make([]byte, 20+len(data))
		be.PutUint64(b[0:], nbdRepMagic)
		be.PutUint32(b[8:], opt)
		be.PutUint32(b[12:], typ)
		be.PutUint32(b[16:], uint32(len(data)))
		copy(b[20:], data)
		_, err := c.Write(b)
		return err
	}
	// Options until NBD_OPT_GO; every other option is unsupported.
	for {
		var hdr struct {
			Magic     uint64
			Opt, Size uint32
		}
		if err := binary.Read(c, be, &hdr); err != nil {
			return err
		}
		if hdr.Magic != nbdOptMagic || hdr.Size > 4096 {
			return fmt.Errorf("%w: bad option header %+v", errProtocol, hdr)
		}
		if _, err := io.CopyN(io.Discard, c, int64(hdr.Size)); err != nil {
			return err
		}
		switch hdr.Opt {
		case nbdOptGo:
			info := make([]byte, 12)
			be.PutUint16(info[0:], nbdInfoExport)
			be.PutUint64(info[2:], uint64(d.size))
			be.PutUint16(info[10:], nbdTransmitFlags)
			if err := optReply(hdr.Opt, nbdRepInfo, info); err != nil {
				return err
			}
			if err := optReply(hdr.Opt, nbdRepAck, nil); err != nil {
				return err
			}
			return d.transmit(c)
		case nbdOptAbort:
			return optReply(hdr.Opt, nbdRepAck, nil)
		default:
			if err := optReply(hdr.Opt, nbdRepErrUnsup, nil); err != nil {
				return err
			}
		}
	}
}

func (d *CacheDisk) transmit(c net.Conn) error {
	be := binary.BigEndian
	for {
		var req struct {
			Magic       uint32
			Flags, Type uint16
			Handle      uint64
			Offset      uint64
			Length      uint32
		}
		if err := binary.Read(c, be, &req); err != nil {
			return err
		}
		if req.Magic != nbdReqMagic {
			return fmt.Errorf("%w: bad request magic %#x", errProtocol, req.Magic)
		}
		var data []byte
		if req.Type == nbdCmdWrite {
			data = make([]byte, req.Length)
			if _, err := io.ReadFull(c, data); err != nil {
				return err
			}
		}
		errno, reply := d.do(req.Type, int64(req.Offset), int64(req.Length), data)
		if req.Type == nbdCmdDisc {
			return nil
		}
		select {
		case <-d.cut:
			continue // the power is off: no answer
		default:
		}
		b := make([]byte, 16, 16+len(reply))
		be.PutUint32(b[0:], nbdReplyMagic)
		be.PutUint32(b[4:], errno)
		be.PutUint64(b[8:], req.Handle)
		if _, err := c.Write(append(b, reply...)); err != nil {
			return err
		}
	}
}

// do carries out one request; it returns the NBD error and the data read.
func (d *CacheDisk) do(typ uint16, off, n int64, data []byte) (uint32, []byte) {
	d.mu.Lock()
	defer d.mu.Unlock()
	select {
	case <-d.cut:
		return 0, nil
	default:
	}
	if typ == nbdCmdRead || typ == nbdCmdWrite {
		if off < 0 || n < 0 || off+n > d.size {
			return nbdEINVAL, nil
		}
	}
	switch typ {
	case nbdCmdRead:
		b, err := d.read(off, n)
		if err != nil {
			return nbdEIO, nil
		}
		return 0, b
	case nbdCmdWrite:
		d.pending = append(d.pending, Write{Offset: off, Data: data})
		return 0, nil
	case nbdCmdFlush:
		view := CacheView{Pending: d.pending, Read: func(off, n int64) []byte {
			b, _ := d.read(off, n)
			return b
		}}
		if d.CutAt != nil && d.CutAt(view) {
			d.lost, d.pending = d.pending, nil
			close(d.cut)
			return 0, nil
		}
		for _, w := range d.pending {
			if _, err := d.file.WriteAt(w.Data, w.Offset); err != nil {
				return nbdEIO, nil
			}
		}
		d.pending = nil
		d.flushes++
		return 0, nil
	case nbdCmdDisc:
		return 0, nil
	default:
		return nbdEINVAL, nil
	}
}

// read returns the bytes at off as the machine sees them; d.mu is held.
func (d *CacheDisk) read(off, n int64) ([]byte, error) {
	b := make([]byte, n)
	if _, err := d.file.ReadAt(b, off); err != nil {
		return nil, err
	}
	for _, w := range d.pending {
		start, end := max(off, w.Offset), min(off+n, w.Offset+int64(len(w.Data)))
		if start < end {
			copy(b[start-off:end-off], w.Data[start-w.Offset:end-w.Offset])
		}
	}
	return b, nil
}
