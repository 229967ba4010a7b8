package gpuinfo

import (
	"fmt"
	"strings"
)

// maxSelectorValues bounds the values of one selector annotation.
const maxSelectorValues = 64

// Selector restricts the cards a pod may use. All values are lower case.
type Selector struct {
	Models        []string
	ExcludeModels []string
	UUIDs         []string
	ExcludeUUIDs  []string
}

// Matches reports whether a card qualifies. modelLower and uuidLower must be
// lower case; Matches does not allocate.
func (s *Selector) Matches(modelLower, uuidLower string) bool {
	if len(s.Models) > 0 && !containsAny(modelLower, s.Models) {
		return false
	}
	if containsAny(modelLower, s.ExcludeModels) {
		return false
	}
	if len(s.UUIDs) > 0 && !equalsAny(uuidLower, s.UUIDs) {
		return false
	}
	return !equalsAny(uuidLower, s.ExcludeUUIDs)
}

// ConstrainsModel reports whether the selector names models to use or avoid.
func (s *Selector) ConstrainsModel() bool {
	return len(s.Models) > 0 || len(s.ExcludeModels) > 0
}

// String describes the selector for messages, e.g. "model A100".
func (s *Selector) String() string {
	var parts []string
	if len(s.Models) > 0 {
		parts = append(parts, "model "+strings.Join(s.Models, " or "))
	}
	if len(s.ExcludeModels) > 0 {
		parts = append(parts, "model not "+strings.Join(s.ExcludeModels, " or "))
	}
	if len(s.UUIDs) > 0 {
		parts = append(parts, "UUID "+strings.Join(s.UUIDs, " or "))
	}
	if len(s.ExcludeUUIDs) > 0 {
		parts = append(parts, "UUID not "+strings.Join(s.ExcludeUUIDs, " or "))
	}
	return strings.Join(parts, ", ")
}

func containsAny(s string, subs []string) bool {
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

func equalsAny(s string, values []string) bool {
	for _, v := range values {
		if s == v {
			return true
		}
	}
	return false
}

// ParseSelector reads the selector annotations of a pod.
func ParseSelector(annotations map[string]string) (Selector, error) {
	var s Selector
	for _, f := range []struct {
		key string
		dst *[]string
	}{
		{ModelAnnotation, &s.Models},
		{ModelExcludeAnnotation, &s.ExcludeModels},
		{UUIDAnnotation, &s.UUIDs},
		{UUIDExcludeAnnotation, &s.ExcludeUUIDs},
	} {
		raw, ok := annotations[f.key]
		if !ok {
			continue
		}
		values, err := splitList(raw)
		if err != nil {
			return Selector{}, fmt.Errorf("annotation %s: %w", f.key, err)
		}
		*f.dst = values
	}
	return s, nil
}

func splitList(raw string) ([]string, error) {
	var values []string
	for _, v := range strings.Split(raw, ",") {
		v = strings.ToLower(strings.TrimSpace(v))
		if v == "" {
			continue
		}
		values = append(values, v)
	}
	if len(values) == 0 {
		return nil, fmt.Errorf("must list at least one value, got %q", raw)
	}
	if len(values) > maxSelectorValues {
		return nil, fmt.Errorf("lists %d values, at most %d are allowed", len(values), maxSelectorValues)
	}
	return values, nil
}
