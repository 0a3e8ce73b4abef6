module github.com/openshift/apiserver-library-go

go 1.24.0
