// Go's math.Pow, math.Log and math.Exp, for hookdet's tests: each input line is an operation and
// its arguments as float64 bits in hex ("pow 4024000000000000 c004000000000000"); each output
// line is the result's bits. Determined's master computes log hyperparameters and ASHA brackets
// with these functions. "split MAX_TRIALS DIVISOR RUNGS..." prints adaptive ASHA's trials per
// bracket ("12,5,3"), its weights summed in order by plain float64 additions, as the master does.
package main

import (
	"bufio"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
)

func argument(field string) float64 {
	bits, err := strconv.ParseUint(field, 16, 64)
	if err != nil {
		panic(err)
	}
	return math.Float64frombits(bits)
}

func main() {
	in := bufio.NewScanner(os.Stdin)
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	for in.Scan() {
		fields := strings.Fields(in.Text())
		if fields[0] == "split" {
			fmt.Fprintln(out, split(fields[1:]))
			continue
		}
		var result float64
		switch fields[0] {
		case "pow":
			result = math.Pow(argument(fields[1]), argument(fields[2]))
		case "log":
			result = math.Log(argument(fields[1]))
		case "exp":
			result = math.Exp(argument(fields[1]))
		default:
			panic("unknown operation " + fields[0])
		}
		fmt.Fprintf(out, "%016x\n", math.Float64bits(result))
	}
}

// split is adaptive ASHA's trials per bracket: weight Pow(divisor, rungs-1)/rungs each, trials in
// proportion (at least 1), what rounding leaves over to the first bracket.
func split(fields []string) string {
	maxTrials := int(argument(fields[0]))
	divisor := argument(fields[1])
	weights := make([]float64, 0, len(fields)-2)
	total := 0.0
	for _, field := range fields[2:] {
		rungs := argument(field)
		weight := math.Pow(divisor, rungs-1) / rungs
		weights = append(weights, weight)
		total += weight
	}
	counts := make([]string, len(weights))
	trials := make([]int, len(weights))
	allocated := 0
	for i, weight := range weights {
		trials[i] = int(weight / total * float64(maxTrials))
		if trials[i] < 1 {
			trials[i] = 1
		}
		allocated += trials[i]
	}
	if maxTrials > allocated {
		trials[0] += maxTrials - allocated
	}
	for i, count := range trials {
		counts[i] = strconv.Itoa(count)
	}
	return strings.Join(counts, ",")
}
