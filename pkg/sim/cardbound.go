package sim

import (
	"cmp"
	"fmt"
	"maps"
	"slices"

	"gonum.org/v1/gonum/mat"

	"github.com/tessera-gpu/tessera/pkg/trace"
)

// cardBound is an upper bound, in GPUs, on the GPU the tasks can be given
// when every task must sit whole on cards: it counts cards and nothing
// else (every card of the fleet takes any task; a task of several whole
// cards is that many tasks of one), and solves exactly, as a linear
// program, how many tasks of each size can be placed when, beside the
// cards' total, every dual-feasible function of Fekete and Schepers in
// cardFunctions holds: a function u of a task's share of a card such that
// tasks that fit one card together never sum above 1 under u, so the tasks
// placed sum to at most the number of cards under u too. A share above 1−ε
// leaves room only for shares below ε, for instance, and counts as a whole
// card; the total alone ignores that.
func cardBound(tasks []trace.Task, cards int) (float64, error) {
	type size struct{ percent, milli int64 }
	counts := map[size]float64{}
	for _, t := range tasks {
		switch {
		case t.NumGPU == 0 || t.GPUMilli == 0:
		case t.GPUMilli < 1000:
			counts[size{(t.GPUMilli + 9) / 10, t.GPUMilli}]++
		default:
			counts[size{cardPercent, 1000}] += float64(t.NumGPU)
		}
	}
	if len(counts) == 0 || cards == 0 {
		return 0, nil
	}
	sizes := slices.SortedFunc(maps.Keys(counts), func(a, b size) int {
		return cmp.Or(cmp.Compare(a.percent, b.percent), cmp.Compare(a.milli, b.milli))
	})
	functions := cardFunctions()
	// Variables: how many tasks of each size are placed, then a slack per
	// row. Rows: each size at most its count, the cards' total, then each
	// function's.
	rows := len(sizes) + 1 + len(functions)
	cols := len(sizes) + rows
	a := mat.NewDense(rows, cols, nil)
	b := make([]float64, rows)
	gain := make([]float64, cols)
	for i, s := range sizes {
		gain[i] = float64(s.milli) / 1000
		a.Set(i, i, 1)
		b[i] = counts[s]
		a.Set(len(sizes), i, float64(s.percent))
		for f, u := range functions {
			a.Set(len(sizes)+1+f, i, float64(u(s.percent)))
		}
	}
	for r := len(sizes); r < rows; r++ {
		b[r] = float64(cards * cardPercent)
	}
	gpus, err := maximize(gain, a, b, len(sizes))
	if err != nil {
		return 0, fmt.Errorf("solving the card relaxation: %w", err)
	}
	return gpus, nil
}

// cardFunctions are the dual-feasible functions cardBound uses, on a
// share of a card in percent, scaled to 100 for a whole card: for ε of 1 to
// 50 %, U_ε (a share above 100−ε counts 100, one below ε counts 0, others
// themselves), and for k of 1 to 10, f_k (a share x counts x when (k+1)x is
// a multiple of 100, else ⌊(k+1)x/100⌋·100/k).
func cardFunctions() []func(int64) int64 {
	var fs []func(int64) int64
	for eps := int64(1); eps <= 50; eps++ {
		fs = append(fs, func(x int64) int64 {
			switch {
			case x > cardPercent-eps:
				return cardPercent
			case x < eps:
				return 0
			}
			return x
		})
	}
	for k := int64(1); k <= 10; k++ {
		fs = append(fs, func(x int64) int64 {
			if (k+1)*x%cardPercent == 0 {
				return x
			}
			return (k + 1) * x / cardPercent * cardPercent / k
		})
	}
	return fs
}
