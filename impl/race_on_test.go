//go:build race

package impl_test

// raceDetector is whether the tests run under the race detector, which
// makes every goroutine several times slower.
const raceDetector = true
