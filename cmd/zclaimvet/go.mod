module github.com/zclaim/zclaim/cmd/zclaimvet

go 1.24.0

require (
	github.com/zclaim/zclaim/zclaimvet v0.0.0-00010101000000-000000000000
	golang.org/x/tools v0.38.0
)

require (
	golang.org/x/mod v0.29.0 // indirect
	golang.org/x/sync v0.17.0 // indirect
)
