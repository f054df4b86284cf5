package v1alpha1

import (
	"testing"

	"gotest.tools/v3/assert"
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
