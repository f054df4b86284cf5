package release

import (
	"strings"
	"testing"

	"gotest.tools/v3/assert"
)

func TestComponentVersion(t *testing.T) {
	for _, tc := range []struct {
		name, list, want, wantErr string
	}{
		{name: "make image's list", list: "bash 5.2.15-2+b7\nbuilt:etcd v3.7.0\nbuilt:kubelet v1.37.2\n", want: "v3.7.0"},
		{name: "not listed", list: "bash 5.2.15-2+b7\nbuilt:kubelet v1.37.2\n", want: ""},
		{name: "empty", list: "", want: ""},
		{name: "another component with the name as prefix", list: "built:etcdctl v3.6.0\n", want: ""},
		{name: "white space around", list: "  built:etcd\tv3.7.1  \r\n", want: "v3.7.1"},
		{name: "listed twice alike", list: "built:etcd v3.7.0\nbuilt:etcd v3.7.0\n", want: "v3.7.0"},
		{name: "listed twice apart", list: "built:etcd v3.7.0\nbuilt:etcd v3.8.0\n", wantErr: "packages.txt names built:etcd twice, with the versions v3.7.0 and v3.8.0"},
		{name: "no version", list: "bash 5\nbuilt:etcd\n", wantErr: `packages.txt line 2 names built:etcd but is not NAME VERSION: "built:etcd"`},
		{name: "too large", list: strings.Repeat("x", MaxPackagesBytes+1), wantErr: "more than the limit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ComponentVersion([]byte(tc.list), EtcdComponent)
			if tc.wantErr != "" {
				assert.ErrorContains(t, err, tc.wantErr)
				return
			}
			assert.NilError(t, err)
			assert.Equal(t, got, tc.want)
		})
	}
}
