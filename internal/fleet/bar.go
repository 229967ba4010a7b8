package fleet

import "strings"

// BarWidth is the number of cells between the brackets of a Bar.
const BarWidth = 16

// Bar draws used out of capacity as an ASCII bar, "[####............]".
func Bar(used, capacity int64) string {
	filled := 0
	if capacity > 0 {
		filled = int(min(max(used, 0), capacity) * BarWidth / capacity)
	}
	return "[" + strings.Repeat("#", filled) + strings.Repeat(".", BarWidth-filled) + "]"
}
