package slots

// SetPowerCut replaces the power-cut hook for a test and returns a function
// that puts the default back.
func SetPowerCut(f func(point string)) (restore func()) {
	old := powerCut
	powerCut = f
	return func() { powerCut = old }
}
