package grpcserver

import (
	"strings"
	"testing"
	"unicode/utf8"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestClientText(t *testing.T) {
	for _, tc := range []struct {
		name, in   string
		wantPrefix string
		cut        bool
	}{
		{"short", "bad listener", "bad listener", false},
		{"at the limit", strings.Repeat("a", maxLoggedText), strings.Repeat("a", maxLoggedText), false},
		{"long", strings.Repeat("a", 1<<20), strings.Repeat("a", maxLoggedText) + "… (1047552 more bytes)", true},
		// "é" is two bytes: the cut falls inside one at maxLoggedText, and must not split it.
		{"rune boundary", "x" + strings.Repeat("é", maxLoggedText), "x" + strings.Repeat("é", maxLoggedText/2-1) + "…", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := ClientText(tc.in)
			if !strings.HasPrefix(got, tc.wantPrefix) {
				t.Errorf("ClientText = %.60q…, want prefix %.60q", got, tc.wantPrefix)
			}
			if !utf8.ValidString(got) {
				t.Error("cut inside a rune")
			}
			if tc.cut && len(got) > maxLoggedText+32 {
				t.Errorf("%d bytes, want about %d", len(got), maxLoggedText)
			}
			if !tc.cut && got != tc.in {
				t.Errorf("short text changed")
			}
		})
	}
}
