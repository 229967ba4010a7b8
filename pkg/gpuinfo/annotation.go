package gpuinfo

import (
	"encoding/json"
	"fmt"
)

// validated is an annotation's content.
type validated interface{ Validate() error }

// decodeAnnotation bounds raw's size, unmarshals it into v and validates it;
// errors name the annotation.
func decodeAnnotation(name, raw string, v validated) error {
	if len(raw) > MaxAnnotationBytes {
		return fmt.Errorf("%s: %d bytes is larger than the %d allowed", name, len(raw), MaxAnnotationBytes)
	}
	if err := json.Unmarshal([]byte(raw), v); err != nil {
		return fmt.Errorf("%s: invalid JSON: %w", name, err)
	}
	return v.Validate()
}

// encodeAnnotation validates v and returns its annotation value.
func encodeAnnotation(v validated) (string, error) {
	if err := v.Validate(); err != nil {
		return "", err
	}
	b, err := json.Marshal(v)
	return string(b), err
}
