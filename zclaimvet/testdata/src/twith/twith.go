// Package twith's test file holds a poller the analyzer reports with -tests.
package twith
