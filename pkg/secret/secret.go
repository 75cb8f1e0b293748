// Package secret reads passwords from files, for the options that take a
// file instead of the password itself (postgres.password.file,
// kafka.sasl.password.file).
package secret

import (
	"fmt"
	"os"
	"strings"
)

// ReadFile reads a password from path, dropping one trailing line end
// ("\n" or "\r\n"), as files written by editors and by echo carry one. Its
// errors name option and the file, never the content.
func ReadFile(option, path string) (string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("%s: cannot read the password file: %w", option, err)
	}
	s := strings.TrimSuffix(string(data), "\n")
	s = strings.TrimSuffix(s, "\r")
	if s == "" {
		return "", fmt.Errorf("%s: the password file %s is empty", option, path)
	}
	return s, nil
}
