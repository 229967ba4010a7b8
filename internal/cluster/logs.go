package cluster

import (
	"flag"

	"k8s.io/klog/v2"
)

// LogToFile sends the process's klog output — the control plane's and the
// scheduler's logs — to the file at path only, so a terminal shows just
// what the program itself prints.
func LogToFile(path string) error {
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	for k, v := range map[string]string{"logtostderr": "false", "alsologtostderr": "false", "stderrthreshold": "FATAL", "log_file": path, "one_output": "true"} {
		if err := fs.Set(k, v); err != nil {
			return err
		}
	}
	return nil
}
