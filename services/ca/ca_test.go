package ca

import (
	"testing"

	"go.uber.org/goleak"

	_ "sailplane.dev/tools/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
