package v1alpha1

import (
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"k8s.io/apimachinery/pkg/util/intstr"
)

func TestMaxUnavailableFor(t *testing.T) {
	intv := func(i int) *intstr.IntOrString { v := intstr.FromInt32(int32(i)); return &v }
	strv := func(s string) *intstr.IntOrString { v := intstr.FromString(s); return &v }
	cases := []struct {
		name    string
		value   *intstr.IntOrString
		total   int
		want    int
		wantErr string
	}{
		{name: "unset means one", value: nil, total: 5, want: 1},
		{name: "integer", value: intv(2), total: 5, want: 2},
		{name: "integer zero pauses", value: intv(0), total: 5, want: 0},
		{name: "integer above total", value: intv(9), total: 5, want: 9},
		{name: "zero percent pauses", value: strv("0%"), total: 5, want: 0},
		{name: "ten percent of five rounds up to one", value: strv("10%"), total: 5, want: 1},
		{name: "forty percent of five", value: strv("40%"), total: 5, want: 2},
		{name: "fifty percent of five rounds down", value: strv("50%"), total: 5, want: 2},
		{name: "hundred percent", value: strv("100%"), total: 5, want: 5},
		{name: "thirty-three percent of three", value: strv("33%"), total: 3, want: 1},
		{name: "percentage of no machines", value: strv("50%"), total: 0, want: 0},
		{name: "negative integer", value: intv(-1), total: 5, wantErr: "maxUnavailable must not be negative"},
		{name: "negative percentage", value: strv("-10%"), total: 5, wantErr: "maxUnavailable must not be negative"},
		{name: "number as string", value: strv("3"), total: 5, wantErr: `maxUnavailable "3" is neither a whole number nor a percentage`},
		{name: "fractional percentage", value: strv("2.5%"), total: 5, wantErr: `maxUnavailable "2.5%" is not a whole percentage`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := DisruptionSpec{MaxUnavailable: tc.value}
			got, err := d.MaxUnavailableFor(tc.total)
			if tc.wantErr != "" {
				assert.ErrorContains(t, err, tc.wantErr)
				return
			}
			assert.NilError(t, err)
			assert.Equal(t, got, tc.want)
		})
	}
}

func TestEndpointURL(t *testing.T) {
	for _, tc := range []struct{ endpoint, want string }{
		{"10.0.2.2:7443", "https://10.0.2.2:7443"},
		{"https://10.0.2.2:7443", "https://10.0.2.2:7443"},
		{"https://api.example.com", "https://api.example.com:443"},
		{"https://api.example.com:6443/", "https://api.example.com:6443"},
		{"[fd00::1]:6443", "https://[fd00::1]:6443"},
		{"http://api.example.com:80", "http://api.example.com:80"},
		{"https://api.example.com:", "https://api.example.com:"},
	} {
		t.Run(tc.endpoint, func(t *testing.T) {
			n := NetworkSpec{Endpoint: tc.endpoint}
			assert.Check(t, is.Equal(n.EndpointURL(), tc.want))
		})
	}
}

func TestFirstServiceIP(t *testing.T) {
	for _, tc := range []struct{ cidr, want, wantErr string }{
		{cidr: "10.96.0.0/16", want: "10.96.0.1"},
		{cidr: "10.96.5.7/16", want: "10.96.0.1"}, // host bits ignored
		{cidr: "10.43.0.0/16", want: "10.43.0.1"},
		{cidr: "192.168.0.0/30", want: "192.168.0.1"},
		{cidr: "fd00:10:96::/112", want: "fd00:10:96::1"},
		{cidr: "", wantErr: `"" is not a CIDR such as 10.96.0.0/16`},
		{cidr: "10.96.0.0", wantErr: `"10.96.0.0" is not a CIDR`},
		{cidr: "10.96.0.0/32", wantErr: `"10.96.0.0/32" holds no address for the kubernetes Service`},
	} {
		t.Run(tc.cidr, func(t *testing.T) {
			ip, err := FirstServiceIP(tc.cidr)
			if tc.wantErr != "" {
				assert.ErrorContains(t, err, tc.wantErr)
				return
			}
			assert.NilError(t, err)
			assert.Check(t, is.Equal(ip.String(), tc.want))
		})
	}
}

func TestNodePodCIDRPrefix(t *testing.T) {
	for _, tc := range []struct {
		cidr    string
		want    int
		wantErr string
	}{
		{cidr: "10.244.0.0/16", want: 24},
		{cidr: "10.0.0.0/8", want: 24},
		{cidr: "192.168.7.0/24", want: 24},
		{cidr: "fd00:10:244::/56", want: 64},
		{cidr: "fd00:10::/48", want: 64},
		{cidr: "fd00:10:244:1::/64", want: 64},
		{cidr: "10.244.0.0", wantErr: `"10.244.0.0" is not a CIDR such as 10.244.0.0/16`},
		{cidr: "", wantErr: `"" is not a CIDR`},
		{cidr: "10.244.0.0/25", wantErr: "10.244.0.0/25 is smaller than one machine's pod range, a /24: give a /24 or larger"},
		{cidr: "fd00:10:244:1::/80", wantErr: "is smaller than one machine's pod range, a /64: give a /48 to /64"},
		{cidr: "fd00::/40", wantErr: "fd00::/40 holds more than the 65536 machine ranges of /64 the controller manager can number"},
	} {
		t.Run(tc.cidr, func(t *testing.T) {
			got, err := NodePodCIDRPrefix(tc.cidr)
			if tc.wantErr != "" {
				assert.ErrorContains(t, err, tc.wantErr)
				return
			}
			assert.NilError(t, err)
			assert.Check(t, is.Equal(got, tc.want))
		})
	}
}

func TestPodCIDROrDefault(t *testing.T) {
	assert.Check(t, is.Equal((&NetworkSpec{}).PodCIDROrDefault(), DefaultPodCIDR))
	assert.Check(t, is.Equal((&NetworkSpec{PodCIDR: "10.42.0.0/16"}).PodCIDROrDefault(), "10.42.0.0/16"))
}

func TestClusterDNSOrDefault(t *testing.T) {
	for _, tc := range []struct {
		name    string
		n       NetworkSpec
		want    string
		wantErr string
	}{
		{name: "default range", n: NetworkSpec{}, want: "10.96.0.10"},
		{name: "own range, host bits ignored", n: NetworkSpec{ServiceCIDR: "10.43.7.9/16"}, want: "10.43.0.10"},
		{name: "IPv6", n: NetworkSpec{ServiceCIDR: "fd00:10:96::/112"}, want: "fd00:10:96::a"},
		{name: "set", n: NetworkSpec{ServiceCIDR: "10.43.0.0/16", ClusterDNS: "10.43.0.53"}, want: "10.43.0.53"},
		{name: "range too small", n: NetworkSpec{ServiceCIDR: "10.96.0.0/29"}, wantErr: "serviceCIDR 10.96.0.0/29 holds no tenth address for the cluster DNS"},
		{name: "not a range", n: NetworkSpec{ServiceCIDR: "10.96.0.0"}, wantErr: `serviceCIDR "10.96.0.0" is not a CIDR`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.n.ClusterDNSOrDefault()
			if tc.wantErr != "" {
				assert.ErrorContains(t, err, tc.wantErr)
				return
			}
			assert.NilError(t, err)
			assert.Check(t, is.Equal(got, tc.want))
		})
	}
}
