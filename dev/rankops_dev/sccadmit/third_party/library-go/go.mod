module github.com/openshift/library-go

go 1.24.0
