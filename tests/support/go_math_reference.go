// Go's math.Pow, math.Log and math.Exp, for hookdet's tests: each input line is an operation and
// its arguments as float64 bits in hex ("pow 4024000000000000 c004000000000000"); each output
// line is the result's bits. Determined's master computes log hyperparameters and ASHA brackets
// with these functions.
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
