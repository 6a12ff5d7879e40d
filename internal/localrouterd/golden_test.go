package localrouterd

import (
	"io"
	"slices"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

// writeText writes the families named in names in the text exposition
// format.
func writeText(w io.Writer, mfs []*dto.MetricFamily, names []string) error {
	enc := expfmt.NewEncoder(w, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, mf := range mfs {
		if slices.Contains(names, mf.GetName()) {
			if err := enc.Encode(mf); err != nil {
				return err
			}
		}
	}
	return nil
}
