// Package browser holds the web console's tests in a real headless
// Chromium, driven through chromedp: a module of its own, so that
// chromedp is no dependency of zclaim's.
package browser
