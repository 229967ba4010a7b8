package chartgen

import (
	"fmt"
	"regexp"
	"slices"
	"strings"

	"sigs.k8s.io/yaml"
)

// profileStart matches the first line of a profile in the scheduler
// configuration's profiles list.
var profileStart = regexp.MustCompile(`^  - schedulerName: (\S+)$`)

// profileNames returns the schedulerName of every profile in a
// KubeSchedulerConfiguration, in order.
func profileNames(config string) ([]string, error) {
	var parsed struct {
		Profiles []struct {
			SchedulerName string `json:"schedulerName"`
		} `json:"profiles"`
	}
	if err := yaml.Unmarshal([]byte(config), &parsed); err != nil {
		return nil, fmt.Errorf("the scheduler configuration: %w", err)
	}
	names := make([]string, len(parsed.Profiles))
	for i, p := range parsed.Profiles {
		names[i] = p.SchedulerName
	}
	return names, nil
}

// guardProfiles returns the configuration's text with each profile (its
// lines and the comment lines just above it) written only when
// scheduler.profiles names it. The text is the file's, line for line, when
// every profile is on. It refuses a layout it does not recognise: profiles
// must be the last top-level key, each item starting with its schedulerName.
// Each line of the file goes through text (braces escaped, values put in).
func guardProfiles(config string, text func(string) string) (string, error) {
	want, err := profileNames(config)
	if err != nil {
		return "", err
	}
	lines := strings.Split(strings.TrimSuffix(config, "\n"), "\n")
	start := slices.Index(lines, "profiles:")
	if start < 0 {
		return "", fmt.Errorf("the scheduler configuration has no top-level profiles: line")
	}
	// A profile begins at the comment lines just above its first line.
	beginsAt := map[int]string{}
	var found []string
	for i := start + 1; i < len(lines); i++ {
		if l := lines[i]; l != "" && !strings.HasPrefix(l, " ") {
			return "", fmt.Errorf("the scheduler configuration: line %d (%q) follows profiles at the top level; profiles must come last", i+1, l)
		}
		m := profileStart.FindStringSubmatch(lines[i])
		if m == nil {
			continue
		}
		j := i
		for j-1 > start && strings.HasPrefix(lines[j-1], "  #") {
			j--
		}
		beginsAt[j] = m[1]
		found = append(found, m[1])
	}
	if !slices.Equal(found, want) {
		return "", fmt.Errorf("the scheduler configuration: profiles found by line %v, parsed %v", found, want)
	}
	out := make([]string, 0, len(lines)+2*len(found))
	open := false
	for i, l := range lines {
		if name, ok := beginsAt[i]; ok {
			if open {
				out = append(out, "{{- end }}")
			}
			out = append(out, fmt.Sprintf("{{- if has %q $.Values.scheduler.profiles }}", name))
			open = true
		}
		out = append(out, text(l))
	}
	if open {
		out = append(out, "{{- end }}")
	}
	return strings.Join(out, "\n"), nil
}
