package node

import (
	"testing"

	"liken.sh/liken/e2e/internal/stuck"
)

// TestMain says where the tests are stuck if they near go test's -timeout.
func TestMain(m *testing.M) { stuck.Main(m) }
