// nodeforge's CUDA library check: the math and communication libraries an application links
// against, one family or several, chosen at compile time:
//   nvcc -DCHECK_CUBLAS -DCHECK_CUFFT -DCHECK_NCCL -cudart shared -o cuda-library-check \
//        cuda-library-check.cu -lcublas -lcufft -lnccl
// First each library reports its version, a call that needs no device: proof that the dynamic
// linker found it in the image and that its symbols resolve. Then, like cuda-check, without a
// GPU (or a driver) it reports the CUDA error and exits with its number: cudaErrorNoDevice (100)
// or cudaErrorInsufficientDriver (35). With a GPU each library computes something small whose
// result is known, checks it and the program exits 0 (1 when a result is wrong, 2 when a library
// call fails).
#include <cstdio>
#include <cuda_runtime.h>
#ifdef CHECK_CUBLAS
#include <cublas_v2.h>
#endif
#ifdef CHECK_CUFFT
#include <cufft.h>
#endif
#ifdef CHECK_NCCL
#include <nccl.h>
#endif

static int fail(const char *what, cudaError_t err) {
  printf("%s: %s (%d): %s\n", what, cudaGetErrorName(err), (int)err, cudaGetErrorString(err));
  return (int)err;
}

static int library_failed(const char *library, const char *what, int status) {
  printf("%s %s FAILED: status %d\n", library, what, status);
  return 2;
}

static int wrong(const char *library, int bad, int n) {
  if (bad == 0) {
    printf("%s ok: %d results checked\n", library, n);
    return 0;
  }
  printf("%s FAILED: %d of %d results wrong\n", library, bad, n);
  return 1;
}

#ifdef CHECK_CUBLAS
static int check_cublas(int n, float *x, float *y) {
  cublasHandle_t handle;
  cublasStatus_t s = cublasCreate(&handle);
  if (s != CUBLAS_STATUS_SUCCESS) return library_failed("cuBLAS", "cublasCreate", (int)s);
  for (int i = 0; i < n; i++) { x[i] = 1.0f; y[i] = (float)i; }
  const float a = 2.0f;
  s = cublasSaxpy(handle, n, &a, x, 1, y, 1);
  cudaDeviceSynchronize();
  cublasDestroy(handle);
  if (s != CUBLAS_STATUS_SUCCESS) return library_failed("cuBLAS", "cublasSaxpy", (int)s);
  int bad = 0;
  for (int i = 0; i < n; i++) bad += y[i] != 2.0f + (float)i;
  return wrong("cuBLAS saxpy", bad, n);
}
#endif

#ifdef CHECK_CUFFT
static int check_cufft(int n, cufftComplex *data) {
  // the transform of a unit impulse is 1 at every frequency
  for (int i = 0; i < n; i++) data[i] = make_cuComplex(i == 0 ? 1.0f : 0.0f, 0.0f);
  cufftHandle plan;
  cufftResult r = cufftPlan1d(&plan, n, CUFFT_C2C, 1);
  if (r != CUFFT_SUCCESS) return library_failed("cuFFT", "cufftPlan1d", (int)r);
  r = cufftExecC2C(plan, data, data, CUFFT_FORWARD);
  cudaDeviceSynchronize();
  cufftDestroy(plan);
  if (r != CUFFT_SUCCESS) return library_failed("cuFFT", "cufftExecC2C", (int)r);
  int bad = 0;
  for (int i = 0; i < n; i++) bad += data[i].x < 0.999f || data[i].x > 1.001f || data[i].y < -0.001f || data[i].y > 0.001f;
  return wrong("cuFFT impulse", bad, n);
}
#endif

#ifdef CHECK_NCCL
static int check_nccl(int n, float *x, float *y) {
  // one rank on device 0: the all-reduce of x is x
  ncclComm_t comm;
  int devices[1] = {0};
  ncclResult_t r = ncclCommInitAll(&comm, 1, devices);
  if (r != ncclSuccess) return library_failed("NCCL", ncclGetErrorString(r), (int)r);
  for (int i = 0; i < n; i++) { x[i] = (float)i; y[i] = -1.0f; }
  r = ncclAllReduce(x, y, n, ncclFloat, ncclSum, comm, 0);
  cudaStreamSynchronize(0);
  ncclCommDestroy(comm);
  if (r != ncclSuccess) return library_failed("NCCL", ncclGetErrorString(r), (int)r);
  int bad = 0;
  for (int i = 0; i < n; i++) bad += y[i] != (float)i;
  return wrong("NCCL all-reduce", bad, n);
}
#endif

int main() {
  int runtime = 0, driver = 0, count = 0;
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&driver);
  printf("cudart %d.%d, driver supports %d.%d\n", runtime / 1000, runtime % 1000 / 10, driver / 1000,
         driver % 1000 / 10);
#ifdef CHECK_CUBLAS
  int major = 0, minor = 0, patch = 0;
  cublasGetProperty(MAJOR_VERSION, &major);
  cublasGetProperty(MINOR_VERSION, &minor);
  cublasGetProperty(PATCH_LEVEL, &patch);
  printf("cuBLAS %d.%d.%d\n", major, minor, patch);
#endif
#ifdef CHECK_CUFFT
  int fft = 0;
  cufftGetVersion(&fft);
  printf("cuFFT %d.%d.%d\n", fft / 1000, fft % 1000 / 100, fft % 100);
#endif
#ifdef CHECK_NCCL
  int nccl = 0;
  ncclGetVersion(&nccl);
  printf("NCCL %d.%d.%d\n", nccl / 10000, nccl % 10000 / 100, nccl % 100);
#endif
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) return fail("cudaGetDeviceCount", err);
  if (count == 0) return fail("cudaGetDeviceCount", cudaErrorNoDevice);
  const int n = 1 << 16;
  float *x, *y;
  if ((err = cudaMallocManaged(&x, n * sizeof(float) * 2)) != cudaSuccess) return fail("cudaMallocManaged", err);
  if ((err = cudaMallocManaged(&y, n * sizeof(float) * 2)) != cudaSuccess) return fail("cudaMallocManaged", err);
  int rc = 0;
#ifdef CHECK_CUBLAS
  if (rc == 0) rc = check_cublas(n, x, y);
#endif
#ifdef CHECK_CUFFT
  if (rc == 0) rc = check_cufft(n, (cufftComplex *)x);
#endif
#ifdef CHECK_NCCL
  if (rc == 0) rc = check_nccl(n, x, y);
#endif
  cudaFree(x);
  cudaFree(y);
  return rc;
}
